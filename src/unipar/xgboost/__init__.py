"""Distributed XGBoost on Ray: a drop-in successor of XGBoost-Ray 0.1.19 (same names).

    from unipar import xgboost as xgboost_ray     # or: from unipar import xgboost_ray
    from unipar.xgboost import RayDMatrix, RayParams, train, predict

Names load on first use, so a training actor imports only the modules it runs.
XGBoost-Ray's module names work too: ``unipar.xgboost.main`` (``driver``) and
``unipar.xgboost.callback`` (``callbacks``), and every submodule under
``unipar.xgboost_ray`` (``unipar.xgboost_ray.session``). Guide, and the differences
from XGBoost-Ray that its own test suite shows: ``docs/xgboost.md``.
"""

from __future__ import annotations

from unipar.lazy import lazy_exports
from unipar.xgboost.aliases import install_aliases

__version__ = "0.1.19"  # the XGBoost-Ray version whose API this follows

_EXPORTS = {
    "Data": "unipar.xgboost.matrix",
    "DistributedCallback": "unipar.xgboost.callbacks",
    "EnvironmentCallback": "unipar.xgboost.callbacks",
    "RayXGBoostActorAvailable": "unipar.xgboost.exceptions",
    "RayXGBoostTrainingError": "unipar.xgboost.exceptions",
    "RayXGBoostTrainingStopped": "unipar.xgboost.exceptions",
    "predict": "unipar.xgboost.driver",
    "train": "unipar.xgboost.driver",
    "RayDMatrix": "unipar.xgboost.matrix",
    "RayDeviceQuantileDMatrix": "unipar.xgboost.matrix",
    "RayQuantileDMatrix": "unipar.xgboost.matrix",
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
install_aliases()


__all__ = sorted(_EXPORTS)
