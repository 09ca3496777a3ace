"""XGBoost-Ray's ``compat`` names: xgboost's own callback base class (XGBoost-Ray kept a
copy for xgboost < 1.3; today's xgboost has it)."""

from xgboost.callback import TrainingCallback

__all__ = ["TrainingCallback"]
