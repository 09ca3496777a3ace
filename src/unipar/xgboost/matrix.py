"""``RayDMatrix``: training data described once on the driver, loaded in shards by the
actors. In-memory data goes through the object store once, already split (each actor
pulls only its piece); files, object refs, partitions and Ray Dataset blocks are
assigned to actors, which read only their own (see :mod:`unipar.xgboost.sources`)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from unipar.errors import ConfigError
from unipar.xgboost.data_sources.partitioned import Partitioned
from unipar.xgboost.exceptions import ShardingError
from unipar.xgboost.sharding import (
    RayShardingMode,
    _get_sharding_indices,
    combine_data,
    split_at_queries,
    split_items,
    split_rows,
)
from unipar.xgboost.sources import (
    FIELDS,
    RayFileType,
    Shard,
    SourceKind,
    as_xgboost_ray_dict,
    concat_dataframes,
    default_distributed,
    expand_paths,
    file_columns,
    flat,
    gathered,
    is_frame,
    kind_of,
    named_columns,
    read_parts,
    read_shard,
    sort_by_query,
    split_frame,
)

# What RayDMatrix takes as data or a field: an array, a DataFrame or Series, a path or
# list of paths, object refs, partitioned data, a Ray Dataset, or a column name
# (XGBoost-Ray's ``Data``).
Data = Any

__all__ = [  # XGBoost-Ray's ``matrix`` module names
    "FIELDS",
    "Data",
    "RayDMatrix",
    "RayDeviceQuantileDMatrix",
    "RayFileType",
    "RayQuantileDMatrix",
    "RayShardingMode",
    "_get_sharding_indices",
    "combine_data",
    "concat_dataframes",
]

_PART_NAMES = {
    SourceKind.FILES: "files",
    SourceKind.OBJECT_REFS: "object refs",
    SourceKind.PARTITIONED: "partitions",
}


class RayDMatrix:
    """Data for :func:`unipar.xgboost.train` and :func:`unipar.xgboost.predict`.

    ``data``: a numpy array, a pandas DataFrame, a CSV or Parquet path, list of paths or
    folder, a list of Ray ``ObjectRef`` of DataFrames, an object with
    ``__partitioned__``, or a Ray Dataset. ``label`` (a column name, a list of names for
    several targets, or an array), ``weight``, ``base_margin``, ``qid`` and the label
    bounds are arrays, or column names when ``data`` has columns; rows are sorted by
    ``qid`` when they are not. ``feature_weights``: one weight per feature (for column
    sampling). ``distributed``: each actor reads its own parts (files, refs, partitions)
    instead of the driver reading all and splitting the rows; by default as XGBoost-Ray
    chose (see :func:`unipar.xgboost.sources.default_distributed`). ``num_actors``: when
    given (and not ``lazy``), the shard count is checked here. Other keyword arguments go
    to ``pandas.read_csv`` / ``read_parquet`` (``columns=[...]``, say).
    """

    quantile = False  # build xgboost's QuantileDMatrix in the actors

    def __init__(
        self,
        data: Data,
        label: Data = None,
        weight: Data = None,
        feature_weights: Data = None,
        base_margin: Data = None,
        missing: float | None = None,
        label_lower_bound: Data = None,
        label_upper_bound: Data = None,
        feature_names: Sequence[str] | None = None,
        feature_types: Sequence[str] | None = None,
        qid: Data = None,
        enable_categorical: bool | None = None,
        num_actors: int | None = None,
        filetype: RayFileType | None = None,
        ignore: Sequence[str] | None = None,
        distributed: bool | None = None,
        sharding: RayShardingMode = RayShardingMode.INTERLEAVED,
        lazy: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("group") is not None:
            raise ConfigError(
                "RayDMatrix takes no group= (sizes of query groups); pass qid=... instead: "
                "the query id of each row"
            )
        self._uid = uuid.uuid4().int
        self.fields = {
            "label": label,
            "weight": weight,
            "base_margin": base_margin,
            "label_lower_bound": label_lower_bound,
            "label_upper_bound": label_upper_bound,
            "qid": qid,
        }
        self.missing = missing
        self.feature_weights = None if feature_weights is None else np.asarray(feature_weights)
        self.feature_names = list(feature_names) if feature_names is not None else None
        self.feature_types = list(feature_types) if feature_types is not None else None
        self.enable_categorical = enable_categorical
        self.num_actors = num_actors
        self.ignore = list(ignore or [])
        self.read_options = {k: v for k, v in kwargs.items() if k != "group"}
        self._shards: dict[int, list[Shard]] = {}
        self.row_order: np.ndarray | None = None  # rows sorted by qid: their old positions
        self.kind = kind_of(data)
        self.filetype: RayFileType | None = None
        self.parts: tuple[Any, ...] = ()
        self.dataset = self.data = self._layout = self.get_parts = None
        if distributed is None:
            distributed = default_distributed(data, self.kind)
        elif distributed and self.kind is SourceKind.IN_MEMORY:
            raise ConfigError(
                f"distributed=True needs data that actors can read on their own (files, "
                f"object refs, partitions, a Ray Dataset), but got {type(data).__name__}; "
                "pass distributed=False, or the data as files"
            )
        elif (
            distributed
            and self.kind is SourceKind.FILES
            and isinstance(data, str)
            and not data.endswith(".parquet")
            and not os.path.isdir(data.removeprefix("file://"))
        ):
            raise ConfigError(
                f"distributed=True needs several files (one file cannot be split between "
                f"actors that read whole files), but got the single file {data}; pass "
                "distributed=False, or a list of files"
            )
        self.distributed = bool(distributed)
        self.sharding = RayShardingMode.FIXED if self.kind is SourceKind.PARTITIONED else sharding
        if self.kind is SourceKind.FILES:
            paths, self.filetype = expand_paths(data, filetype)
            self.parts = tuple(paths)
        elif self.kind is SourceKind.OBJECT_REFS:
            self.parts = tuple(data) if isinstance(data, (list, tuple)) else (data,)
        elif self.kind is SourceKind.PARTITIONED:
            self._layout = data.__partitioned__
            self.get_parts = self._layout["get"]
            self.parts = tuple(p["data"] for p in Partitioned.row_partitions(self._layout))
        elif self.kind is SourceKind.RAY_DATASET:
            self.dataset = data
        else:
            self.data = self._in_memory(gathered(data))
        if num_actors is not None and not lazy:
            self.assert_enough_shards_for_actors(num_actors)
        if self.kind is SourceKind.FILES:
            self._check_files()
        elif self.kind is SourceKind.RAY_DATASET:
            self._check_columns(list(data.schema().names))

    # -- checks on the driver ------------------------------------------------------
    def _in_memory(self, data: Any) -> dict[str, Any]:
        if is_frame(data):
            self._check_columns(list(data.columns))
            parts = split_frame(data, self.fields, self.ignore)
            if self.feature_names is None:
                self.feature_names = [str(c) for c in parts["data"].columns]
            matrix: Any = parts["data"]
        else:
            matrix = np.asarray(data)
            if matrix.ndim != 2:
                raise ConfigError(
                    f"RayDMatrix data must be 2-dimensional (rows x features), but got shape "
                    f"{matrix.shape}; reshape it, e.g. data.reshape(-1, 1)"
                )
            parts = {"data": matrix}
            for name, value in named_columns(self.fields).items():
                raise ConfigError(
                    f"{name}={value!r} names a column, but the data is a numpy array "
                    "without columns; pass the values as an array instead"
                )
        rows = len(matrix)
        weights = self.feature_weights
        if weights is not None and len(weights) != matrix.shape[1]:
            raise ConfigError(
                f"feature_weights must have one weight per feature, but the data has "
                f"{matrix.shape[1]} features and feature_weights has {len(weights)}"
            )
        for name, value in self.fields.items():
            if value is None or name in parts:
                continue
            array = flat(np.asarray(gathered(value)))
            if len(array) != rows:
                raise ConfigError(
                    f"{name} must have one value per row, but the data has {rows} rows and "
                    f"{name} has {len(array)}; pass a {name} of length {rows}"
                )
            parts[name] = array
        self.row_order = sort_by_query(parts)
        return parts

    def _check_columns(self, columns: list[str]) -> None:
        for name, value in named_columns(self.fields).items():
            for column in [value] if isinstance(value, str) else value:
                if column not in columns:
                    raise ConfigError(
                        f"{name} column {column!r} is not in the data; its columns are {columns}"
                    )

    def _check_files(self) -> None:
        for path in self.parts:
            try:
                columns = file_columns(path, self.filetype, self.read_options)
            except Exception as error:
                raise ConfigError(
                    f"cannot read {self.filetype.name if self.filetype else ''} file {path} "
                    f"({type(error).__name__}: {error}); check the path and the file type"
                ) from error
            self._check_columns(columns)

    def carrying_data(self) -> RayDMatrix:
        """A copy that travels with its data (to a task that runs ``train`` for the
        caller: ``_remote``); a matrix sent to actors leaves its data behind."""
        carried = object.__new__(type(self))  # not copy.copy: that pickles, leaving data
        carried.__dict__.update(self.__dict__, _carry_data=True)
        return carried

    def __getstate__(self) -> dict[str, Any]:
        """What actors need: how to read and build a shard, not the data itself (the
        shards travel through the object store, once)."""
        state = dict(self.__dict__)
        if state.pop("_carry_data", False):
            state["_shards"] = {}
            return state
        state.update(data=None, _shards={}, dataset=None, _layout=None)
        state["fields"] = {
            k: v if k in named_columns(self.fields) else None for k, v in self.fields.items()
        }
        return state

    def __eq__(self, other: object) -> bool:
        """The same matrix, also after a trip through Ray (XGBoost-Ray's identity)."""
        return isinstance(other, RayDMatrix) and other._uid == self._uid

    def __hash__(self) -> int:
        return self._uid

    @property
    def has_label(self) -> bool:
        return self.fields["label"] is not None

    # -- sharding ------------------------------------------------------------------
    def assert_enough_shards_for_actors(self, num_actors: int) -> None:
        """Every actor must get data: a part (file, object ref, partition) each when they
        read parts, a row each otherwise (a Ray Dataset is cut to fit)."""
        if self.kind is SourceKind.RAY_DATASET:
            return
        if self.distributed or self.data is None:
            count, unit = len(self.parts), _PART_NAMES[self.kind]
            if not self.distributed:
                return  # read centrally later: rows are counted then
        else:
            count, unit = len(self.data["data"]), "rows"
        if count < num_actors:
            fix = (
                "use distributed=False to split rows instead"
                if self.distributed and self.kind is not SourceKind.PARTITIONED
                else f"split the data into at least {num_actors} {unit}"
            )
            raise ShardingError(
                f"{count} {unit} cannot feed {num_actors} actors (each actor needs at least "
                f"one); use at most {count} actors, or {fix}"
            )

    def shards(self, num_actors: int, actors: Sequence[Any] | None = None) -> list[Shard]:
        """One :class:`Shard` per actor (computed once per actor count). With the
        ``actors`` given, Ray Dataset blocks and partitions go preferably to actors on
        their node."""
        if num_actors not in self._shards:
            self._shards[num_actors] = self._make_shards(num_actors, actors)
        return self._shards[num_actors]

    def _make_shards(self, n: int, actors: Sequence[Any] | None) -> list[Shard]:
        import ray  # noqa: PLC0415 (heavy: Ray)

        hints = list(actors) if actors is not None and len(actors) == n else None
        if self.kind is SourceKind.RAY_DATASET:
            # One block per actor, then split by blocks: every row trains (split's
            # equal=True would drop rows to even out the parts).
            parts = self.dataset.repartition(n).split(n, equal=False, locality_hints=hints)
            return [Shard(dataset=part) for part in parts]
        if self.distributed:
            positions = list(range(len(self.parts)))
            if self.kind is SourceKind.PARTITIONED and hints is not None:
                by_rank = Partitioned.positions_by_actor(self._layout, hints)
                groups = [by_rank[rank] for rank in range(n)]
            else:  # fixed partitions without actors to place them near: in order
                mode = self.sharding
                if mode is RayShardingMode.FIXED:
                    mode = RayShardingMode.BATCH
                groups = split_items(positions, n, mode)
            return [
                Shard(parts=tuple(self.parts[i] for i in group), part_indices=tuple(group))
                for group in groups
            ]
        if self.data is None:  # parts read centrally, on the driver
            frame, _ = read_parts(self.kind, self.parts, self)
            self.data = self._in_memory(frame)
        self.assert_enough_shards_for_actors(n)
        rows = len(self.data["data"])
        if "qid" in self.data:
            groups = split_at_queries(np.asarray(self.data["qid"]), n)
        else:
            groups = split_rows(rows, n, self.sharding)
        # Slices, not index arrays: a piece is a view of the data, copied once, into the
        # object store (one actor: the whole array, as it is), and read there zero-copy.
        shards = []
        for rows_slice in groups:
            piece = {key: _take(value, rows_slice) for key, value in self.data.items()}
            shards.append(Shard(rows=ray.put(piece), indices=rows_slice))
        return shards

    # -- XGBoost-Ray's loading API -------------------------------------------------
    def load_data(self, num_actors: int | None = None, rank: int | None = None) -> None:
        """Make the shards for ``num_actors`` actors (in-memory rows go to the object
        store); ``train`` and ``predict`` do this themselves."""
        self.shards(self._actor_count(num_actors))

    def get_data(self, rank: int, num_actors: int | None = None) -> dict[str, Any]:
        """The shard of actor ``rank`` as XGBoost-Ray returns it: pandas objects under the
        names of ``xgboost.DMatrix``'s arguments (``data``, ``label``, ``qid``, ...; None
        where absent), read here."""
        shard = self.shards(self._actor_count(num_actors))[rank]
        return as_xgboost_ray_dict(read_shard(self, shard), self.feature_weights)

    def unload_data(self) -> None:
        """Forget the shards (the object store frees in-memory pieces)."""
        self._shards.clear()

    def _actor_count(self, num_actors: int | None) -> int:
        count = num_actors if num_actors is not None else self.num_actors
        if count is None:
            raise ConfigError(
                "the number of actors is unknown: pass num_actors=... to RayDMatrix or to "
                "load_data()/get_data()"
            )
        return count

    def __repr__(self) -> str:
        if self.kind is SourceKind.IN_MEMORY:
            source = f"{len(self.data['data'])} rows"
        elif self.kind is SourceKind.RAY_DATASET:
            source = "Ray Dataset"
        else:
            source = f"{len(self.parts)} {_PART_NAMES[self.kind]}"
        return f"RayDMatrix({source}, sharding={self.sharding.name})"


class RayQuantileDMatrix(RayDMatrix):
    """Same data, loaded as xgboost's ``QuantileDMatrix`` (pre-binned; less memory)."""

    quantile = True


class RayDeviceQuantileDMatrix(RayQuantileDMatrix):
    """XGBoost-Ray's name for the GPU variant; xgboost's ``QuantileDMatrix`` serves CPU
    and GPU alike."""


def _take(value: Any, rows: slice) -> Any:
    return value.iloc[rows] if is_frame(value) else value[rows]
