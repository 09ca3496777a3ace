"""Distributed XGBoost on Ray: a drop-in successor of XGBoost-Ray (same names).

    from unipar.xgboost import RayDMatrix, RayParams, train, predict

Names load on first use, so a training actor imports only the modules it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

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
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'unipar.xgboost' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(_EXPORTS)


__all__ = sorted(_EXPORTS)
