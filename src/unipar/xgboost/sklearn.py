"""scikit-learn estimators that train on Ray actors (XGBoost-Ray's names).

``n_jobs`` sets the number of actors (unset: one per node, as ``RayParams()``) unless
``ray_params`` is passed to ``fit``; prediction runs in this process, or on actors when
``predict`` gets ``ray_params``. Labels follow today's xgboost: classes are 0..n-1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xgboost as xgb

from unipar.xgboost.driver import predict as ray_predict
from unipar.xgboost.driver import train
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams


class _RayFit:
    """Shared by every estimator: build RayDMatrix objects, train on actors."""

    def _fit_params(self, y: Any) -> dict[str, Any]:
        """The booster parameters for labels ``y`` (the classifier adds its objective)."""
        return self.get_xgb_params()

    def fit(
        self,
        X: Any,
        y: Any,
        *,
        sample_weight: Any = None,
        base_margin: Any = None,
        eval_set: Any = None,
        sample_weight_eval_set: Any = None,
        xgb_model: Any = None,
        ray_params: Any = None,
        _remote: bool | None = None,
        ray_dmatrix_params: dict[str, Any] | None = None,
        **_: Any,
    ) -> Any:
        self._dmatrix_params = dict(ray_dmatrix_params or {})  # more RayDMatrix arguments
        return self._ray_fit(
            X,
            y,
            self._fit_params(y),
            sample_weight=sample_weight,
            base_margin=base_margin,
            eval_set=eval_set,
            sample_weight_eval_set=sample_weight_eval_set,
            xgb_model=xgb_model,
            ray_params=ray_params,
        )

    def _ray_params(self, ray_params: RayParams | dict[str, Any] | None) -> RayParams:
        if ray_params is not None:
            return RayParams(**ray_params) if isinstance(ray_params, dict) else ray_params
        jobs = getattr(self, "n_jobs", None)
        return RayParams(num_actors=jobs if jobs and jobs > 0 else 0)

    def _ray_fit(
        self,
        X: Any,
        y: Any,
        params: dict[str, Any],
        *,
        sample_weight: Any = None,
        base_margin: Any = None,
        qid: Any = None,
        eval_set: Any = None,
        sample_weight_eval_set: Any = None,
        eval_qid: Any = None,
        xgb_model: Any = None,
        ray_params: Any = None,
    ) -> Any:
        params = {k: v for k, v in params.items() if k != "n_jobs"}  # n_jobs counts actors
        options = {
            "missing": self.missing,
            "enable_categorical": self.enable_categorical,
            **getattr(self, "_dmatrix_params", {}),
        }
        dtrain = RayDMatrix(X, y, weight=sample_weight, base_margin=base_margin, qid=qid, **options)
        evals = []
        for i, (eval_x, eval_y) in enumerate(eval_set or []):
            weight = sample_weight_eval_set[i] if sample_weight_eval_set else None
            group = eval_qid[i] if eval_qid else None
            evals.append(
                (RayDMatrix(eval_x, eval_y, weight=weight, qid=group, **options), f"validation_{i}")
            )
        if isinstance(xgb_model, xgb.XGBModel):
            xgb_model = xgb_model.get_booster()
        result: dict[str, Any] = {}
        self._Booster = train(
            params,
            dtrain,
            self.get_num_boosting_rounds(),
            evals=evals,
            evals_result=result,
            ray_params=self._ray_params(ray_params),
            xgb_model=xgb_model,
            callbacks=self.callbacks,
            early_stopping_rounds=self.early_stopping_rounds,
        )
        self._set_evaluation_result(result)
        return self

    def _distributed_margin(self, X: Any, ray_params: Any, **kwargs: Any) -> np.ndarray:
        return ray_predict(
            self.get_booster(), RayDMatrix(X), self._ray_params(ray_params), **kwargs
        )


class RayXGBRegressor(_RayFit, xgb.XGBRegressor):
    def predict(
        self, X: Any, output_margin: bool = False, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        if ray_params is None:
            return super().predict(X, *args, output_margin=output_margin, **kwargs)
        return self._distributed_margin(X, ray_params, output_margin=output_margin)


class RayXGBClassifier(_RayFit, xgb.XGBClassifier):
    def _fit_params(self, y: Any) -> dict[str, Any]:
        classes = np.unique(np.asarray(y))
        if not np.array_equal(classes, np.arange(len(classes))):
            raise ValueError(
                f"Invalid classes inferred from unique values of `y`. Expected: "
                f"{np.arange(len(classes))}, got {classes}; encode labels as 0..n-1 "
                "(sklearn.preprocessing.LabelEncoder)"
            )
        self.n_classes_ = len(classes)
        params = self.get_xgb_params()
        if self.n_classes_ > 2:
            if params.get("objective") != "multi:softmax":
                params["objective"] = "multi:softprob"
            params["num_class"] = self.n_classes_
        self.objective = params["objective"]
        return params

    def predict_proba(
        self, X: Any, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        if ray_params is None:
            return super().predict_proba(X, *args, **kwargs)
        scores = self._distributed_margin(X, ray_params)
        return scores if scores.ndim == 2 else np.column_stack([1 - scores, scores])

    def predict(
        self, X: Any, output_margin: bool = False, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        """Classes, or with ``output_margin`` the raw scores (one column per class for
        more than two classes), as ``xgboost.XGBClassifier.predict``."""
        if ray_params is None:
            return super().predict(X, *args, output_margin=output_margin, **kwargs)
        if output_margin:
            return self._distributed_margin(X, ray_params, output_margin=True)
        return self.predict_proba(X, ray_params=ray_params).argmax(axis=1)


class RayXGBRFRegressor(RayXGBRegressor, xgb.XGBRFRegressor):
    """Random forest: one round of ``n_estimators`` parallel trees."""


class RayXGBRFClassifier(RayXGBClassifier, xgb.XGBRFClassifier):
    """Random forest: one round of ``n_estimators`` parallel trees."""


class RayXGBRanker(_RayFit, xgb.XGBRanker):
    """Learning to rank; rows must be sorted by ``qid``, and each query stays on one actor."""

    def fit(
        self,
        X: Any,
        y: Any,
        *,
        group: Any = None,
        qid: Any = None,
        sample_weight: Any = None,
        base_margin: Any = None,
        eval_set: Any = None,
        eval_group: Any = None,
        eval_qid: Any = None,
        xgb_model: Any = None,
        ray_params: Any = None,
        **_: Any,
    ) -> RayXGBRanker:
        if qid is None and group is not None:
            qid = np.repeat(np.arange(len(group)), group)
        if eval_qid is None and eval_group is not None:
            eval_qid = [np.repeat(np.arange(len(g)), g) for g in eval_group]
        if qid is None:
            raise ValueError("ranking needs query ids: pass qid=... (or group=...)")
        return self._ray_fit(
            X,
            y,
            self.get_xgb_params(),
            sample_weight=sample_weight,
            base_margin=base_margin,
            qid=qid,
            eval_set=eval_set,
            eval_qid=eval_qid,
            xgb_model=xgb_model,
            ray_params=ray_params,
        )
