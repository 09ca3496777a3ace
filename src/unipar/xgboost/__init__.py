"""Distributed XGBoost on Ray: a drop-in successor of XGBoost-Ray (same names).

from unipar.xgboost import RayDMatrix, RayParams, train, predict
"""

from unipar.xgboost.callbacks import DistributedCallback
from unipar.xgboost.driver import RayXGBoostTrainingError, predict, train
from unipar.xgboost.matrix import (
    RayDeviceQuantileDMatrix,
    RayDMatrix,
    RayFileType,
    RayShardingMode,
    combine_data,
)
from unipar.xgboost.params import RayParams

__all__ = [
    "DistributedCallback",
    "RayDMatrix",
    "RayDeviceQuantileDMatrix",
    "RayFileType",
    "RayParams",
    "RayShardingMode",
    "RayXGBoostTrainingError",
    "combine_data",
    "predict",
    "train",
]
