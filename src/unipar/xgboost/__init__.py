"""Distributed XGBoost on Ray: a drop-in successor of XGBoost-Ray (same names).

    from unipar.xgboost import RayDMatrix, RayParams, train, predict

Names load on first use, so a training actor imports only the modules it runs.
"""

from __future__ import annotations

from unipar.lazy import lazy_exports

_EXPORTS = {
    "DistributedCallback": "unipar.xgboost.callbacks",
    "RayXGBoostTrainingError": "unipar.xgboost.driver",
    "predict": "unipar.xgboost.driver",
    "train": "unipar.xgboost.driver",
    "RayDMatrix": "unipar.xgboost.matrix",
    "RayDeviceQuantileDMatrix": "unipar.xgboost.matrix",
    "RayFileType": "unipar.xgboost.matrix",
    "RayShardingMode": "unipar.xgboost.matrix",
    "combine_data": "unipar.xgboost.matrix",
    "RayParams": "unipar.xgboost.params",
    "RayXGBClassifier": "unipar.xgboost.sklearn",
    "RayXGBRFClassifier": "unipar.xgboost.sklearn",
    "RayXGBRFRegressor": "unipar.xgboost.sklearn",
    "RayXGBRanker": "unipar.xgboost.sklearn",
    "RayXGBRegressor": "unipar.xgboost.sklearn",
    "TuneReportCallback": "unipar.xgboost.tune",
    "TuneReportCheckpointCallback": "unipar.xgboost.tune",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
