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
from unipar.xgboost.sklearn import (
    RayXGBClassifier,
    RayXGBRanker,
    RayXGBRegressor,
    RayXGBRFClassifier,
    RayXGBRFRegressor,
)

__all__ = [
    "DistributedCallback",
    "RayDMatrix",
    "RayDeviceQuantileDMatrix",
    "RayFileType",
    "RayParams",
    "RayShardingMode",
    "RayXGBClassifier",
    "RayXGBRFClassifier",
    "RayXGBRFRegressor",
    "RayXGBRanker",
    "RayXGBRegressor",
    "RayXGBoostTrainingError",
    "combine_data",
    "predict",
    "train",
]
