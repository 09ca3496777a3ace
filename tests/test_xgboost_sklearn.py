"""The scikit-learn estimators give xgboost's own results (same data, same parameters)."""

from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from unipar.xgboost import (
    RayParams,
    RayXGBClassifier,
    RayXGBRanker,
    RayXGBRegressor,
    RayXGBRFClassifier,
    RayXGBRFRegressor,
)


def test_classifier_binary_and_multiclass(ray_cluster):
    for loader in (load_breast_cancer, load_iris):
        x, y = loader(return_X_y=True)
        ours = RayXGBClassifier(n_estimators=10, n_jobs=2, random_state=0).fit(x, y)
        reference = xgb.XGBClassifier(n_estimators=10, random_state=0).fit(x, y)
        np.testing.assert_array_equal(ours.predict(x), reference.predict(x))
        distributed = ours.predict_proba(x, ray_params=RayParams(num_actors=2))
        np.testing.assert_allclose(distributed, reference.predict_proba(x), atol=1e-6)


def test_classifier_rejects_unencoded_labels():
    x, y = load_breast_cancer(return_X_y=True)
    with pytest.raises(ValueError, match=r"Invalid classes.*LabelEncoder"):
        RayXGBClassifier(n_estimators=2).fit(x, y + 1)


def test_regressor_with_eval_set(ray_cluster):
    x, y = load_diabetes(return_X_y=True)
    ours = RayXGBRegressor(n_estimators=10).fit(x, y, eval_set=[(x, y)])
    reference = xgb.XGBRegressor(n_estimators=10).fit(x, y)
    np.testing.assert_allclose(ours.predict(x), reference.predict(x), rtol=1e-5)
    assert len(ours.evals_result()["validation_0"]["rmse"]) == 10


def test_random_forests(ray_cluster):
    x, y = load_breast_cancer(return_X_y=True)
    forest = RayXGBRFClassifier(n_estimators=5, random_state=0).fit(x, y)
    assert forest.get_booster().num_boosted_rounds() == 1
    assert (forest.predict(x) == y).mean() > 0.95
    # Forests subsample rows, and each actor draws its own sample, so trees differ from
    # one process's; the fit quality must not: R^2 within 0.05 of xgboost's.
    from sklearn.metrics import r2_score

    xr, yr = load_diabetes(return_X_y=True)
    regressor = RayXGBRFRegressor(n_estimators=5, random_state=0).fit(xr, yr)
    reference = xgb.XGBRFRegressor(n_estimators=5, random_state=0).fit(xr, yr)
    assert abs(r2_score(yr, regressor.predict(xr)) - r2_score(yr, reference.predict(xr))) < 0.05


def test_ranker_keeps_queries_whole(ray_cluster):
    rng = np.random.default_rng(0)
    qid = np.repeat(np.arange(50), 10)
    x = rng.normal(size=(500, 5))
    y = (x[:, 0] + 0.3 * rng.normal(size=500) > 0).astype(int)
    ours = RayXGBRanker(n_estimators=5).fit(x, y, qid=qid)
    reference = xgb.XGBRanker(n_estimators=5).fit(x, y, qid=qid)
    np.testing.assert_allclose(ours.predict(x), reference.predict(x), rtol=1e-5, atol=1e-6)
