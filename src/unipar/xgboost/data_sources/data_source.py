"""The file types a ``RayDMatrix`` reads (XGBoost-Ray's ``RayFileType``)."""

from enum import Enum


class RayFileType(Enum):
    CSV = 1
    PARQUET = 2
