"""``unipar.xgboost`` under XGBoost-Ray's name: ``from unipar import xgboost_ray`` and
``import unipar.xgboost_ray as xgboost_ray`` give the ``unipar.xgboost`` module itself;
``unipar.xgboost_ray.session`` and the other submodules are the same modules too."""

import sys

import unipar.xgboost

sys.modules[__name__] = unipar.xgboost
