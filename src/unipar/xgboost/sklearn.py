"""scikit-learn estimators that train on Ray actors (XGBoost-Ray's names and keywords).

``fit`` takes xgboost's arguments and XGBoost-Ray's: ``eval_metric``,
``early_stopping_rounds`` and ``callbacks`` (xgboost now takes these in the
constructor; given to ``fit`` they apply to that fit), ``ray_params``, ``_remote`` and
``ray_dmatrix_params`` (more ``RayDMatrix`` arguments); ``X`` may be a ``RayDMatrix``
(then ``eval_set`` holds ``(RayDMatrix, name)`` pairs, and a classifier needs
``num_class``). ``n_jobs`` sets the number of actors (unset: one per node, as
``RayParams()``) unless ``ray_params`` is given. Prediction runs in this process, or on
actors when ``predict`` gets ``ray_params`` or a ``RayDMatrix``. Labels follow today's
xgboost: classes are 0..n-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xgboost as xgb
from xgboost.sklearn import _metric_decorator, _objective_decorator, ltr_metric_decorator

from unipar.xgboost.driver import predict as ray_predict
from unipar.xgboost.driver import train
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams

_DISTRIBUTED_ONLY = ("ray_params", "_remote", "ray_dmatrix_params")


class _RayFit:
    """Shared by every estimator: build RayDMatrix objects, train on actors."""

    def _fit_params(self, y: Any, dtrain: RayDMatrix, given: bool) -> dict[str, Any]:
        """The booster parameters (the classifier adds its objective and classes);
        ``given``: ``X`` was a RayDMatrix."""
        params = self.get_xgb_params()
        if callable(self.objective):
            params["objective"] = _DEFAULT_OBJECTIVE[self._get_type()]
        return params

    def fit(
        self,
        X: Any,
        y: Any,
        *,
        sample_weight: Any = None,
        base_margin: Any = None,
        eval_set: Any = None,
        eval_metric: Any = None,
        early_stopping_rounds: int | None = None,
        verbose: bool | int | None = True,
        xgb_model: Any = None,
        sample_weight_eval_set: Any = None,
        base_margin_eval_set: Any = None,
        feature_weights: Any = None,
        callbacks: Sequence[Any] | None = None,
        ray_params: RayParams | dict[str, Any] | None = None,
        _remote: bool | None = None,
        ray_dmatrix_params: dict[str, Any] | None = None,
    ) -> Any:
        return self._ray_fit(
            X,
            y,
            sample_weight=sample_weight,
            base_margin=base_margin,
            eval_set=eval_set,
            eval_metric=eval_metric,
            early_stopping_rounds=early_stopping_rounds,
            verbose=verbose,
            xgb_model=xgb_model,
            sample_weight_eval_set=sample_weight_eval_set,
            base_margin_eval_set=base_margin_eval_set,
            feature_weights=feature_weights,
            callbacks=callbacks,
            ray_params=ray_params,
            _remote=_remote,
            ray_dmatrix_params=ray_dmatrix_params,
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
        *,
        qid: Any = None,
        eval_qid: Any = None,
        eval_metric: Any = None,
        early_stopping_rounds: int | None = None,
        verbose: bool | int | None = True,
        xgb_model: Any = None,
        feature_weights: Any = None,
        callbacks: Sequence[Any] | None = None,
        ray_params: Any = None,
        _remote: bool | None = None,
        ray_dmatrix_params: dict[str, Any] | None = None,
        **data: Any,
    ) -> Any:
        given = isinstance(X, RayDMatrix)
        params = self._fit_params(y, X, given)
        model, metric, params, feature_weights = self._configure_fit(
            xgb_model, params, feature_weights
        )
        if eval_metric is not None:
            metric = self._fit_time_metric(eval_metric, params) or metric
        dtrain, evals = self._matrices(
            X,
            y,
            qid=qid,
            eval_qid=eval_qid,
            feature_weights=feature_weights,
            options={
                "missing": self.missing,
                "enable_categorical": self.enable_categorical,
                **(ray_dmatrix_params or {}),
            },
            **data,
        )
        params.pop("n_jobs", None)  # n_jobs counts actors; each actor uses its CPUs
        result: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        self._Booster = train(
            params,
            dtrain,
            self.get_num_boosting_rounds(),
            evals=evals,
            evals_result=result,
            additional_results=extra,
            ray_params=self._ray_params(ray_params),
            _remote=_remote,
            xgb_model=model,
            obj=_objective_decorator(self.objective) if callable(self.objective) else None,
            custom_metric=metric,
            verbose_eval=verbose,
            callbacks=callbacks if callbacks is not None else self.callbacks,
            early_stopping_rounds=(
                early_stopping_rounds
                if early_stopping_rounds is not None
                else self.early_stopping_rounds
            ),
        )
        if not callable(self.objective):
            self.objective = params["objective"]
        self.additional_results_ = extra
        self._set_evaluation_result(result)
        return self

    def _fit_time_metric(self, eval_metric: Any, params: dict[str, Any]) -> Any:
        """``fit(eval_metric=...)`` (XGBoost-Ray's, for this fit): names go into
        ``params``; a callable becomes the custom metric, as xgboost does for the
        constructor's ``eval_metric``."""
        metrics = (
            [eval_metric] if isinstance(eval_metric, str) or callable(eval_metric) else eval_metric
        )
        names = [m for m in metrics if isinstance(m, str)]
        if names:
            params["eval_metric"] = names
        custom = [m for m in metrics if callable(m)]
        if len(custom) > 1:
            raise ValueError("only one custom eval_metric (a callable) is supported")
        if not custom:
            return None
        if self._get_type() == "ranker":
            return ltr_metric_decorator(custom[0], self.n_jobs)
        return _metric_decorator(custom[0])

    def _matrices(
        self,
        X: Any,
        y: Any,
        *,
        sample_weight: Any = None,
        base_margin: Any = None,
        qid: Any = None,
        eval_set: Any = None,
        sample_weight_eval_set: Any = None,
        base_margin_eval_set: Any = None,
        eval_qid: Any = None,
        feature_weights: Any = None,
        options: dict[str, Any],
    ) -> tuple[RayDMatrix, list[tuple[RayDMatrix, str]]]:
        """The training matrix and the evaluation pairs, as xgboost builds them (an
        evaluation set that is the training data reuses its matrix)."""
        eval_set = list(eval_set or [])
        if isinstance(X, RayDMatrix):
            if any(not isinstance(m, RayDMatrix) or not isinstance(n, str) for m, n in eval_set):
                raise ValueError(
                    "If X is a RayDMatrix, all elements of `eval_set` must be (RayDMatrix, "
                    "str) tuples."
                )
            return X, eval_set
        if any(isinstance(a, RayDMatrix) or isinstance(b, RayDMatrix) for a, b in eval_set):
            raise ValueError(
                "If X is not a RayDMatrix, all `eval_set` elements must be (array_like, "
                "array_like) tuples."
            )
        for name, per_set in (
            ("sample_weight_eval_set", sample_weight_eval_set),
            ("base_margin_eval_set", base_margin_eval_set),
            ("eval_qid", eval_qid),
        ):
            if per_set is not None and len(per_set) != len(eval_set):
                raise ValueError(
                    f"{name} must have one entry per eval_set entry, but got {len(per_set)} "
                    f"for {len(eval_set)} evaluation sets"
                )
        dtrain = RayDMatrix(
            X,
            y,
            weight=sample_weight,
            base_margin=base_margin,
            qid=qid,
            feature_weights=feature_weights,
            **options,
        )
        evals = []
        for i, (eval_x, eval_y) in enumerate(eval_set):
            weight = sample_weight_eval_set[i] if sample_weight_eval_set else None
            margin = base_margin_eval_set[i] if base_margin_eval_set else None
            group = eval_qid[i] if eval_qid else None
            if eval_x is X and eval_y is y and weight is sample_weight and margin is base_margin:
                evals.append((dtrain, f"validation_{i}"))
                continue
            matrix = RayDMatrix(
                eval_x, eval_y, weight=weight, base_margin=margin, qid=group, **options
            )
            evals.append((matrix, f"validation_{i}"))
        return dtrain, evals

    def predict(
        self, X: Any, output_margin: bool = False, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        """Predictions here, or on actors with ``ray_params`` (or a RayDMatrix)."""
        if not self._on_actors(X, ray_params, kwargs.get("_remote")):
            kwargs = {k: v for k, v in kwargs.items() if k not in _DISTRIBUTED_ONLY}
            return super().predict(X, *args, output_margin=output_margin, **kwargs)
        return self._distributed_predict(X, ray_params, output_margin=output_margin, **kwargs)

    def _on_actors(self, X: Any, ray_params: Any, _remote: Any) -> bool:
        return ray_params is not None or _remote or isinstance(X, RayDMatrix)

    def _distributed_predict(
        self,
        X: Any,
        ray_params: Any,
        *,
        base_margin: Any = None,
        _remote: bool | None = None,
        ray_dmatrix_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        data = X
        if not isinstance(X, RayDMatrix):
            options = {"missing": self.missing, **(ray_dmatrix_params or {})}
            data = RayDMatrix(X, base_margin=base_margin, **options)
        return ray_predict(
            self.get_booster(), data, self._ray_params(ray_params), _remote=_remote, **kwargs
        )


_DEFAULT_OBJECTIVE = {  # what xgboost trains with a callable objective
    "classifier": "binary:logistic",
    "regressor": "reg:squarederror",
    "ranker": "rank:ndcg",
}


class RayXGBRegressor(_RayFit, xgb.XGBRegressor):
    _estimator_type = "regressor"


class RayXGBClassifier(_RayFit, xgb.XGBClassifier):
    _estimator_type = "classifier"

    def _fit_params(self, y: Any, dtrain: Any, given: bool) -> dict[str, Any]:
        params = self.get_xgb_params()
        if given:  # the labels sit in the RayDMatrix: the classes must be given
            if "num_class" not in params:
                raise ValueError(
                    "`num_class` must be set during initialization if X is a RayDMatrix "
                    "(the labels are in the matrix): RayXGBClassifier(num_class=...)"
                )
            self.n_classes_ = int(params.pop("num_class"))
        else:
            classes = np.unique(np.asarray(y))
            if not np.array_equal(classes, np.arange(len(classes))):
                raise ValueError(
                    f"Invalid classes inferred from unique values of `y`. Expected: "
                    f"{np.arange(len(classes))}, got {classes}; encode labels as 0..n-1 "
                    "(sklearn.preprocessing.LabelEncoder)"
                )
            self.n_classes_ = len(classes)
        if callable(self.objective):
            params["objective"] = "binary:logistic"
        if self.n_classes_ > 2:
            if params.get("objective") != "multi:softmax":
                params["objective"] = "multi:softprob"
            params["num_class"] = self.n_classes_
        return params

    def predict_proba(
        self, X: Any, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        if not self._on_actors(X, ray_params, kwargs.get("_remote")):
            kwargs = {k: v for k, v in kwargs.items() if k not in _DISTRIBUTED_ONLY}
            return super().predict_proba(X, *args, **kwargs)
        margin = self.objective == "multi:softmax"
        scores = self._distributed_predict(X, ray_params, output_margin=margin, **kwargs)
        if margin:  # softmax of the raw scores
            exp = np.exp(scores - scores.max(axis=1, keepdims=True))
            return exp / exp.sum(axis=1, keepdims=True)
        return scores if scores.ndim == 2 else np.column_stack([1 - scores, scores])

    def predict(
        self, X: Any, output_margin: bool = False, *args: Any, ray_params: Any = None, **kwargs: Any
    ) -> np.ndarray:
        """Classes, or with ``output_margin`` the raw scores (one column per class for
        more than two classes), as ``xgboost.XGBClassifier.predict``."""
        if not self._on_actors(X, ray_params, kwargs.get("_remote")):
            kwargs = {k: v for k, v in kwargs.items() if k not in _DISTRIBUTED_ONLY}
            return super().predict(X, *args, output_margin=output_margin, **kwargs)
        if output_margin:
            return self._distributed_predict(X, ray_params, output_margin=True, **kwargs)
        return self.predict_proba(X, ray_params=ray_params, **kwargs).argmax(axis=1)


class RayXGBRFRegressor(RayXGBRegressor, xgb.XGBRFRegressor):
    """Random forest: one round of ``n_estimators`` parallel trees."""


class RayXGBRFClassifier(RayXGBClassifier, xgb.XGBRFClassifier):
    """Random forest: one round of ``n_estimators`` parallel trees."""


class RayXGBRanker(_RayFit, xgb.XGBRanker):
    """Learning to rank; rows are sorted by ``qid`` (stable) and each query stays on one
    actor."""

    _estimator_type = "ranker"

    def fit(  # type: ignore[override]
        self,
        X: Any,
        y: Any,
        *,
        group: Any = None,
        qid: Any = None,
        eval_group: Any = None,
        eval_qid: Any = None,
        **options: Any,
    ) -> RayXGBRanker:
        """``RayXGBRanker.fit``: ``qid`` (the query of each row) or ``group`` (the size
        of each query), and the other keywords of :meth:`_RayFit.fit`."""
        if qid is None and group is not None:
            qid = np.repeat(np.arange(len(group)), group)
        if eval_qid is None and eval_group is not None:
            eval_qid = [np.repeat(np.arange(len(g)), g) for g in eval_group]
        if qid is None and not isinstance(X, RayDMatrix):
            raise ValueError("ranking needs query ids: pass qid=... (or group=...)")
        return self._ray_fit(X, y, qid=qid, eval_qid=eval_qid, **options)
