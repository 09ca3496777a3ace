"""The package name ``xgboost_ray`` over ``unipar.xgboost``, for running XGBoost-Ray's own
tests (``xgboost_ray/tests``, vendored) against unipar: ``xgboost_ray.RayDMatrix`` is
``unipar.xgboost.RayDMatrix`` and ``xgboost_ray.main`` is ``unipar.xgboost.driver``;
``xgboost_ray.tests`` is this folder's own. Ray's worker processes import it too (the
suite runner puts this folder on ``PYTHONPATH``)."""

import importlib

import unipar.xgboost as _unipar_xgboost
from unipar.xgboost.aliases import install_aliases

install_aliases(__name__)


def __getattr__(name: str):
    """unipar.xgboost's names, and its submodules on first use (``xgboost_ray.main``)."""
    try:
        return getattr(_unipar_xgboost, name)
    except AttributeError:
        pass
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        raise AttributeError(name) from error
