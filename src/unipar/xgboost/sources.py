"""What a ``RayDMatrix`` holds, and how a shard of it is read (in the actor, or on the
driver for central loading). The kinds of data are XGBoost-Ray's data sources:

- in memory: numpy arrays, pandas DataFrames and Series (and Modin or Dask frames,
  gathered on the driver), split by rows;
- files: CSV or Parquet paths (or a folder of Parquet files), local or ``file://``;
- Ray's object store: a list of ``ObjectRef`` of DataFrames or arrays;
- partitioned data: any object with ``__partitioned__`` (its partitions stay on their
  nodes and go to actors on the same node where possible);
- a Ray Dataset.

Files, object refs and partitions are *parts*: an actor reads its parts whole.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from unipar.errors import ConfigError
from unipar.xgboost.data_sources.dask import Dask
from unipar.xgboost.data_sources.data_source import RayFileType
from unipar.xgboost.data_sources.modin import Modin
from unipar.xgboost.data_sources.object_store import ObjectStore
from unipar.xgboost.data_sources.partitioned import Partitioned
from unipar.xgboost.data_sources.ray_dataset import RayDataset

# The DMatrix fields a RayDMatrix carries besides the features (XGBoost-Ray's names).
FIELDS = ("label", "weight", "base_margin", "label_lower_bound", "label_upper_bound", "qid")


class SourceKind(Enum):
    IN_MEMORY = 1
    FILES = 2
    OBJECT_REFS = 3
    PARTITIONED = 4
    RAY_DATASET = 5


@dataclass(frozen=True)
class Shard:
    """What one actor loads: object refs of its rows (``rows``, with ``indices`` of those
    rows in the whole), or parts to read whole (files, object refs or partitions, with
    their positions in the matrix's list), or a dataset split."""

    rows: Any = None  # ObjectRef of {"data": ..., field: ...}
    indices: slice | None = None  # the rows of the whole, for putting predictions back
    parts: tuple[Any, ...] = ()
    part_indices: tuple[int, ...] = ()
    dataset: Any = None


def is_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def is_paths(data: Any) -> bool:
    return isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple))
        and len(data) > 0
        and isinstance(data[0], (str, os.PathLike))
    )


def gathered(data: Any) -> Any:
    """A Modin or Dask frame as pandas, on the driver (XGBoost-Ray read them in place on
    their nodes; unipar gathers them and splits the rows); anything else unchanged."""
    for source in (Modin, Dask):
        if source.is_data_type(data):
            return source.load_data(data)
    return data


def kind_of(data: Any) -> SourceKind:
    if is_paths(data):
        return SourceKind.FILES
    if RayDataset.is_data_type(data):
        return SourceKind.RAY_DATASET
    if ObjectStore.is_data_type(data):
        return SourceKind.OBJECT_REFS
    if Partitioned.is_data_type(data):
        return SourceKind.PARTITIONED
    return SourceKind.IN_MEMORY


def default_distributed(data: Any, kind: SourceKind) -> bool:
    """XGBoost-Ray's choice when ``distributed`` is not given: each actor reads its own
    parts for several files, a single Parquet file, a Ray Dataset and partitioned data;
    one CSV file, object refs and in-memory data are read centrally and split by rows."""
    if kind is SourceKind.FILES:
        return not isinstance(data, (str, os.PathLike)) or str(data).endswith(".parquet")
    return kind in (SourceKind.RAY_DATASET, SourceKind.PARTITIONED)


def expand_paths(data: Any, filetype: RayFileType | None) -> tuple[list[str], RayFileType]:
    """The files behind ``data`` (a path, a list of paths, or a folder of Parquet or CSV
    files, searched recursively) and their type."""
    paths = [str(data)] if isinstance(data, (str, os.PathLike)) else [str(p) for p in data]
    if len(paths) == 1 and os.path.isdir(_local(paths[0])):
        folder = _local(paths[0])
        kind = filetype or RayFileType.PARQUET
        pattern = "*.parquet" if kind is RayFileType.PARQUET else "*.csv"
        paths = sorted(glob.glob(os.path.join(folder, "**", pattern), recursive=True))
        if not paths:
            raise ConfigError(f"the folder {folder} holds no {pattern} files; check the path")
        return paths, kind
    return paths, filetype or filetype_of(paths[0])


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def filetype_of(path: str) -> RayFileType:
    if path.endswith((".parquet", ".pq")):
        return RayFileType.PARQUET
    if path.endswith((".csv", ".csv.gz", ".txt")):
        return RayFileType.CSV
    raise ConfigError(
        f"cannot tell the file type of {path}; pass filetype=RayFileType.CSV or PARQUET"
    )


def file_columns(path: str, filetype: RayFileType, read_options: Mapping[str, Any]) -> list[str]:
    """A file's column names, read from its header or schema only."""
    import pandas as pd  # noqa: PLC0415 (heavy: pandas)

    if filetype is RayFileType.PARQUET:
        import pyarrow.parquet as pq  # noqa: PLC0415 (heavy: pyarrow)

        names = list(pq.read_schema(_local(path)).names)
        wanted = read_options.get("columns")
        return [n for n in names if wanted is None or n in wanted]
    return list(pd.read_csv(_local(path), nrows=1, **read_options).columns)


def read_parts(kind: SourceKind, parts: Sequence[Any], matrix: Any) -> tuple[Any, list[int]]:
    """The rows of ``parts`` as one DataFrame, and the rows of each part."""
    import pandas as pd  # noqa: PLC0415 (heavy: pandas)

    if kind is SourceKind.FILES:
        read = pd.read_parquet if matrix.filetype is RayFileType.PARQUET else pd.read_csv
        frames = [read(_local(path), **matrix.read_options) for path in parts]
    else:
        import ray  # noqa: PLC0415 (heavy: Ray)

        values = (
            matrix.get_parts(list(parts))
            if kind is SourceKind.PARTITIONED
            else ray.get(list(parts))
        )
        frames = [v if is_frame(v) else pd.DataFrame(np.asarray(v)) for v in values]
    rows = [len(f) for f in frames]
    if not frames:
        return None, rows
    return pd.concat(frames, ignore_index=True), rows


def named_columns(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields given as a column name, or a list of names (a multi-column label)."""
    return {
        name: value
        for name, value in fields.items()
        if isinstance(value, str)
        or (isinstance(value, list) and value and isinstance(value[0], str))
    }


def split_frame(frame: Any, fields: Mapping[str, Any], ignore: Sequence[str]) -> dict[str, Any]:
    """A frame as ``{"data": features, field: values}``: the named columns taken out,
    ignored columns dropped, the other columns in their order."""
    frame = frame.drop(columns=[c for c in ignore if c in frame.columns])
    named = named_columns(fields)
    values = {k: flat(frame[v].to_numpy()) for k, v in named.items()}
    taken = [c for v in named.values() for c in ([v] if isinstance(v, str) else v)]
    return {"data": frame.drop(columns=taken), **values}


def flat(values: np.ndarray) -> np.ndarray:
    """A field with one column as a vector (a one-column label DataFrame, say)."""
    return values.ravel() if values.ndim == 2 and values.shape[1] == 1 else values


def sort_by_query(parts: dict[str, Any]) -> np.ndarray | None:
    """Rows sorted by ``qid`` (stable), as xgboost's ranking needs; returns the order
    applied (row ``i`` now is row ``order[i]`` before), or None when already sorted."""
    qid = parts.get("qid")
    if qid is None or not np.any(np.diff(np.asarray(qid)) < 0):
        return None
    order = np.argsort(np.asarray(qid), kind="stable")
    for key, value in parts.items():
        if key in FIELDS or key == "data":
            parts[key] = (
                value.iloc[order].reset_index(drop=True) if is_frame(value) else value[order]
            )
    return order


def as_xgboost_ray_dict(parts: Mapping[str, Any], feature_weights: Any) -> dict[str, Any]:
    """A shard as XGBoost-Ray's ``RayDMatrix.get_data`` returns it: pandas objects under
    the names of ``xgboost.DMatrix``'s arguments (None where absent)."""
    import pandas as pd  # noqa: PLC0415 (heavy: pandas)

    data = parts.get("data")
    if data is not None and not is_frame(data):
        array = np.asarray(data)
        data = pd.DataFrame(array, columns=[f"f{i}" for i in range(array.shape[1])])
    out: dict[str, Any] = {"data": data, "feature_weights": feature_weights}
    for name in FIELDS:
        value = parts.get(name)
        if value is not None:
            value = np.asarray(value)
            value = pd.Series(value, name=name) if value.ndim == 1 else pd.DataFrame(value)
        out[name] = value
    return out


def concat_dataframes(dfs: Sequence[Any]) -> Any:
    """XGBoost-Ray's helper: the non-None frames one below the other, renumbered."""
    import pandas as pd  # noqa: PLC0415 (heavy: pandas)

    return pd.concat([df for df in dfs if df is not None], ignore_index=True)


def read_shard(matrix: Any, shard: Shard) -> dict[str, Any]:
    """The shard's rows: ``{"data": ..., "label": ..., ...}``, with ``part_rows`` (rows of
    each part read) and ``order`` (the shard's sort by ``qid``, or None)."""
    import ray  # noqa: PLC0415 (heavy: Ray)

    if shard.rows is not None:
        return dict(ray.get(shard.rows))
    if shard.dataset is not None:
        frame, rows = shard.dataset.to_pandas(), []
    else:
        frame, rows = read_parts(matrix.kind, shard.parts, matrix)
    if frame is None:  # an actor without parts (XGBoost-Ray's get_data on too few files)
        return {"data": None, "part_rows": rows, "order": None}
    parts = split_frame(frame, matrix.fields, matrix.ignore)
    order = sort_by_query(parts)
    return {**parts, "order": order, "part_rows": rows}
