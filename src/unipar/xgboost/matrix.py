"""``RayDMatrix``: training data described once on the driver, loaded in shards by the
actors. In-memory data goes through the object store once, already split (each actor
pulls only its piece); files and Ray Dataset blocks are assigned to actors, which read
only their own."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from unipar.errors import ConfigError

# What RayDMatrix takes as data or a field: an array, a DataFrame or Series, a path or
# list of paths, a Ray Dataset, or a column name (XGBoost-Ray's ``Data``).
Data = Any

FIELDS = ("label", "weight", "base_margin", "label_lower_bound", "label_upper_bound", "qid")


class RayShardingMode(Enum):
    INTERLEAVED = 1  # row i goes to actor i % n
    BATCH = 2  # contiguous blocks
    FIXED = 3  # files or dataset blocks as given, one group per actor


class RayFileType(Enum):
    CSV = 1
    PARQUET = 2


@dataclass(frozen=True)
class Shard:
    """What one actor loads: object refs of its rows (``pieces``, with ``indices`` of
    those rows in the whole), or files to read, or a dataset split."""

    pieces: Any = None  # ObjectRef of {"data": ..., field: ...}
    indices: slice | None = None  # the rows of the whole, for putting predictions back
    files: tuple[str, ...] = ()
    file_indices: tuple[int, ...] = ()  # positions of ``files`` in the matrix's list
    dataset: Any = None


def _is_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def _is_ray_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("ray.data")


class RayDMatrix:
    """Data for :func:`unipar.xgboost.train` and :func:`unipar.xgboost.predict`.

    ``data``: a numpy array, a pandas DataFrame, a CSV or Parquet path or list of paths, or
    a Ray Dataset. ``label``, ``weight``, ``base_margin``, ``qid`` and the label bounds are
    arrays, or column names when ``data`` has columns; ``feature_weights``: one weight per
    feature (for column sampling). ``num_actors``, ``distributed`` and
    ``lazy`` are accepted for compatibility with XGBoost-Ray and have no effect: the shards
    follow ``ray_params.num_actors`` and are always made when training starts.
    """

    def __init__(
        self,
        data: Any,
        label: Any = None,
        weight: Any = None,
        base_margin: Any = None,
        missing: float | None = None,
        label_lower_bound: Any = None,
        label_upper_bound: Any = None,
        feature_names: Sequence[str] | None = None,
        feature_types: Sequence[str] | None = None,
        qid: Any = None,
        feature_weights: Any = None,
        enable_categorical: bool | None = None,
        num_actors: int | None = None,
        filetype: RayFileType | None = None,
        ignore: Sequence[str] | None = None,
        distributed: bool | None = None,
        sharding: RayShardingMode = RayShardingMode.INTERLEAVED,
        lazy: bool = False,
        **kwargs: Any,
    ) -> None:
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
        self.sharding = sharding
        self.kwargs = kwargs
        self._shards: dict[int, list[Shard]] = {}
        self.files: tuple[str, ...] = ()
        self.dataset = None
        if isinstance(data, (str, os.PathLike)) or (
            isinstance(data, (list, tuple)) and data and isinstance(data[0], (str, os.PathLike))
        ):
            paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
            self.files = tuple(str(p) for p in paths)
            self.filetype = filetype or _filetype(self.files[0])
            self._check_files()
            self.data = None
        elif _is_ray_dataset(data):
            self.dataset = data
            self.filetype = None
            self.data = None
            self._check_columns(list(data.schema().names))
        else:
            self.filetype = None
            self.data = self._in_memory(data)

    # -- checks on the driver ------------------------------------------------------
    def _in_memory(self, data: Any) -> dict[str, Any]:
        if _is_frame(data):
            self._check_columns(list(data.columns))
            frame = data.drop(columns=[c for c in self.ignore if c in data.columns])
            named = {k: v for k, v in self.fields.items() if isinstance(v, str)}
            values = {k: frame[v].to_numpy() for k, v in named.items()}
            frame = frame.drop(columns=list(named.values()))
            if self.feature_names is None:
                self.feature_names = [str(c) for c in frame.columns]
            matrix: Any = frame
        else:
            matrix = np.asarray(data)
            if matrix.ndim != 2:
                raise ConfigError(
                    f"RayDMatrix data must be 2-dimensional (rows x features), but got shape "
                    f"{matrix.shape}; reshape it, e.g. data.reshape(-1, 1)"
                )
            values = {}
            for name, value in self.fields.items():
                if isinstance(value, str):
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
            if value is None or isinstance(value, str):
                continue
            array = np.asarray(value)
            if len(array) != rows:
                raise ConfigError(
                    f"{name} must have one value per row, but the data has {rows} rows and "
                    f"{name} has {len(array)}; pass a {name} of length {rows}"
                )
            values[name] = array
        return {"data": matrix, **values}

    def _check_columns(self, columns: list[str]) -> None:
        for name, value in self.fields.items():
            if isinstance(value, str) and value not in columns:
                raise ConfigError(
                    f"{name} column {value!r} is not in the data; its columns are {columns}"
                )

    def _check_files(self) -> None:
        import pandas as pd  # noqa: PLC0415 (heavy: pandas)

        for path in self.files:
            try:
                if self.filetype is RayFileType.PARQUET:
                    import pyarrow.parquet as pq  # noqa: PLC0415 (heavy: pyarrow)

                    columns = list(pq.read_schema(path).names)
                else:
                    columns = list(pd.read_csv(path, nrows=1).columns)
            except Exception as error:
                raise ConfigError(
                    f"cannot read {self.filetype.name if self.filetype else ''} file {path} "
                    f"({type(error).__name__}: {error}); check the path and the file type"
                ) from error
            self._check_columns(columns)

    def __getstate__(self) -> dict[str, Any]:
        """What actors need: how to read and build a shard, not the data itself (the
        shards travel through the object store, once)."""
        state = dict(self.__dict__)
        state["data"] = None
        state["_shards"] = {}
        state["dataset"] = None
        state["fields"] = {k: (v if isinstance(v, str) else None) for k, v in self.fields.items()}
        return state

    @property
    def has_label(self) -> bool:
        return self.fields["label"] is not None

    # -- sharding ------------------------------------------------------------------
    def shards(self, num_actors: int, actors: Sequence[Any] | None = None) -> list[Shard]:
        """One :class:`Shard` per actor (computed once per actor count). With the
        ``actors`` given, Ray Dataset blocks go preferably to actors on their node."""
        if num_actors not in self._shards:
            self._shards[num_actors] = self._make_shards(num_actors, actors)
        return self._shards[num_actors]

    def _make_shards(self, n: int, actors: Sequence[Any] | None) -> list[Shard]:
        import ray  # noqa: PLC0415 (heavy: Ray)

        if self.files:
            if len(self.files) < n:
                raise ConfigError(
                    f"{len(self.files)} files cannot feed {n} actors (each actor reads whole "
                    f"files); use at most {len(self.files)} actors or split the files"
                )
            groups = _split(list(range(len(self.files))), n, self.sharding)
            return [
                Shard(files=tuple(self.files[i] for i in group), file_indices=tuple(group))
                for group in groups
            ]
        if self.dataset is not None:
            # One block per actor, then split by blocks: every row trains (split's
            # equal=True would drop rows to even out the parts).
            hints = list(actors) if actors is not None and len(actors) == n else None
            parts = self.dataset.repartition(n).split(n, equal=False, locality_hints=hints)
            return [Shard(dataset=part) for part in parts]
        rows = len(self.data["data"])
        if rows < n:
            raise ConfigError(f"{rows} rows cannot be split over {n} actors; use fewer actors")
        if "qid" in self.data:
            groups = _split_at_queries(np.asarray(self.data["qid"]), n)
        else:
            groups = _split_rows(rows, n, self.sharding)
        # Slices, not index arrays: a piece is a view of the data, copied once, into the
        # object store (one actor: the whole array, as it is), and read there zero-copy.
        shards = []
        for rows_slice in groups:
            piece = {key: _take(value, rows_slice) for key, value in self.data.items()}
            shards.append(Shard(pieces=ray.put(piece), indices=rows_slice))
        return shards

    def __repr__(self) -> str:
        source = (
            f"{len(self.files)} files"
            if self.files
            else ("Ray Dataset" if self.dataset is not None else f"{len(self.data['data'])} rows")
        )
        return f"RayDMatrix({source}, sharding={self.sharding.name})"


class RayDeviceQuantileDMatrix(RayDMatrix):
    """Same data, loaded as xgboost's ``QuantileDMatrix`` (pre-binned; less memory)."""

    quantile = True


def _take(value: Any, rows: slice) -> Any:
    return value.iloc[rows] if _is_frame(value) else value[rows]


def _split_rows(rows: int, n: int, mode: RayShardingMode) -> list[slice]:
    if mode is RayShardingMode.INTERLEAVED:
        return [slice(i, rows, n) for i in range(n)]
    bounds = np.cumsum([0, *[len(p) for p in np.array_split(np.arange(rows), n)]])
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _split(items: list[int], n: int, mode: RayShardingMode) -> list[list[int]]:
    if mode is RayShardingMode.INTERLEAVED:
        return [items[i::n] for i in range(n)]
    return [list(part) for part in np.array_split(np.asarray(items), n)]


def _split_at_queries(qid: np.ndarray, n: int) -> list[slice]:
    """Contiguous shards cut only where the query id changes, so that every query's rows
    stay on one actor (ranking objectives compare rows within a query)."""
    if np.any(np.diff(qid) < 0):
        raise ConfigError("rows must be sorted by qid for distributed ranking; sort them first")
    starts = np.flatnonzero(np.diff(qid)) + 1  # where a new query begins
    if len(starts) + 1 < n:
        raise ConfigError(f"{len(starts) + 1} queries cannot be split over {n} actors")
    # Each cut: the query start nearest its even share, after the previous cut and with
    # a start left for every later one (n shards, none empty, however uneven the queries).
    ideal = [round(len(qid) * k / n) for k in range(1, n)]
    cuts, low = [], 0
    for k, point in enumerate(ideal):
        high = len(starts) - (len(ideal) - k)
        i = low + int(np.abs(starts[low : high + 1] - point).argmin())
        cuts.append(int(starts[i]))
        low = i + 1
    bounds = [0, *cuts, len(qid)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def _filetype(path: str) -> RayFileType:
    if path.endswith((".parquet", ".pq")):
        return RayFileType.PARQUET
    if path.endswith((".csv", ".csv.gz", ".txt")):
        return RayFileType.CSV
    raise ConfigError(
        f"cannot tell the file type of {path}; pass filetype=RayFileType.CSV or PARQUET"
    )


def combine_data(sharding: RayShardingMode, data: Sequence[Any]) -> Any:
    """Put per-actor results back into one array in the original row order."""
    parts = [np.asarray(d) for d in data]
    if sharding is RayShardingMode.INTERLEAVED:
        total = sum(len(p) for p in parts)
        out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
        for i, part in enumerate(parts):
            out[i :: len(parts)] = part
        return out
    return np.concatenate(parts)
