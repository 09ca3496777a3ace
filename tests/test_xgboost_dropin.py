"""XGBoost-Ray code runs unchanged: the session API inside actors, the queue back to the
driver, default resources, verbose, how an actor's failure reaches the driver, DMatrix
extras (label bounds, base margin, weights, feature weights) and prediction outputs."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import ray.cloudpickle
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_iris

from unipar import xgboost as xgboost_ray
from unipar.xgboost.session import get_actor_rank, get_rabit_rank, put_queue

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # callbacks run in actors

PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "seed": 0, "max_depth": 3}


class Report(xgb.callback.TrainingCallback):
    """Sends each actor's ranks after the first round, and a function that the driver
    runs (it leaves a file named by the pid of the process that ran it)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def after_iteration(self, model, epoch, evals_log):
        if epoch == 0:
            put_queue({"actor": get_actor_rank(), "rabit": get_rabit_rank()})
            path = Path(self.directory)
            put_queue(lambda: (path / f"ran-in-{os.getpid()}").touch())
        return False


class Resources(xgboost_ray.DistributedCallback):
    """Leaves a file per actor naming its rank, the CPUs Ray gave it, and the value of
    the variable an EnvironmentCallback sets."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def before_train(self, actor):
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        env = os.environ.get("UNIPAR_TEST_VALUE")
        Path(self.directory, f"actor{get_actor_rank()}-cpus{cpus:g}-{env}").touch()


def test_session_queue_resources_and_verbose(ray_cluster, tmp_path, caplog):
    x, y = load_breast_cancer(return_X_y=True)
    extra = {}
    with caplog.at_level(logging.DEBUG, logger="unipar.xgboost"):
        # 2 actors and cpus_per_actor=0: the cluster's 4 CPUs divided, 2 each
        xgboost_ray.train(
            PARAMS,
            xgboost_ray.RayDMatrix(x, y),
            3,
            additional_results=extra,
            callbacks=[Report(str(tmp_path))],
            ray_params=xgboost_ray.RayParams(
                num_actors=2,
                verbose=True,
                distributed_callbacks=[
                    xgboost_ray.EnvironmentCallback({"UNIPAR_TEST_VALUE": "7"}),
                    Resources(str(tmp_path)),
                ],
            ),
        )
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("[RayXGBoost] Created 2 new actors" in m for m in info), info
    assert any("[RayXGBoost] Finished XGBoost training" in m for m in info), info
    returns = extra["callback_returns"]
    assert [[item["actor"] for item in r] for r in returns] == [[0], [1]]
    assert sorted(item["rabit"] for r in returns for item in r) == [0, 1]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["actor0-cpus2-7", "actor1-cpus2-7", f"ran-in-{os.getpid()}"]
    assert extra["total_n"] == len(x) and extra["training_time_s"] <= extra["total_time_s"]

    # the default: one actor (one node) with all 4 CPUs; quiet at INFO when verbose=False
    caplog.clear()
    for path in tmp_path.iterdir():
        path.unlink()
    with caplog.at_level(logging.DEBUG, logger="unipar.xgboost"):
        xgboost_ray.train(
            PARAMS,
            xgboost_ray.RayDMatrix(x, y),
            2,
            additional_results=extra,
            ray_params=xgboost_ray.RayParams(
                verbose=False, distributed_callbacks=[Resources(str(tmp_path))]
            ),
        )
    assert extra["num_actors"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["actor0-cpus4-None"]
    messages = {r.levelno: r.getMessage() for r in caplog.records if "RayXGBoost" in r.getMessage()}
    assert logging.INFO not in messages and logging.DEBUG in messages


class FailOnActor1(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        if epoch == 2 and get_actor_rank() == 1:
            raise ValueError("boom in round 3")
        return False


def test_an_actor_error_names_the_actor_and_its_traceback(ray_cluster):
    x, y = load_breast_cancer(return_X_y=True)
    with pytest.raises(xgboost_ray.RayXGBoostTrainingError) as caught:
        xgboost_ray.train(
            PARAMS,
            xgboost_ray.RayDMatrix(x, y),
            10,
            callbacks=[FailOnActor1()],
            ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1),
        )
    error = caught.value
    assert error.actor_rank == 1
    assert "training failed on actor 1" in str(error) and "ValueError: boom in round 3" in str(
        error
    )
    assert "in after_iteration" in error.remote_traceback


def test_survival_labels_base_margin_weights_and_feature_weights(ray_cluster):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6))
    lower = np.exp(x[:, 0] + 0.1 * rng.normal(size=600))
    upper = np.where(rng.random(600) < 0.3, np.inf, lower * 1.5)  # 30% right-censored
    weight, margin = rng.uniform(0.5, 2, size=600), rng.normal(scale=0.1, size=600)
    params = {"objective": "survival:aft", "tree_method": "hist", "seed": 0, "max_depth": 3}
    bounds = {"label_lower_bound": lower, "label_upper_bound": upper}
    booster = xgboost_ray.train(
        params,
        xgboost_ray.RayDMatrix(x, lower, weight=weight, base_margin=margin, **bounds),
        10,
        ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1),
        verbose_eval=True,  # an xgboost.train keyword, passed on
    )
    reference = xgb.train(
        params, xgb.DMatrix(x, lower, weight=weight, base_margin=margin, **bounds), 10
    )
    test = xgb.DMatrix(x, base_margin=margin)
    np.testing.assert_allclose(booster.predict(test), reference.predict(test), rtol=1e-5)

    # zero feature weights: those features are never sampled, so never split on
    sampled = xgboost_ray.train(
        {**PARAMS, "colsample_bynode": 0.5},
        xgboost_ray.RayDMatrix(x, (x[:, 0] + x[:, 5] > 0), feature_weights=[0, 0, 0, 1, 1, 1]),
        5,
        ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1),
    )
    assert set(sampled.get_score()) <= {"f3", "f4", "f5"}


def test_multiclass_predictions_have_xgboosts_shapes(ray_cluster):
    x, y = load_iris(return_X_y=True)
    params = {"objective": "multi:softprob", "num_class": 3, "seed": 0, "max_depth": 2}
    ray_params = xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1)
    booster = xgboost_ray.train(params, xgboost_ray.RayDMatrix(x, y), 4, ray_params=ray_params)
    for kwargs in ({}, {"output_margin": True}, {"pred_leaf": True}, {"pred_contribs": True}):
        ours = xgboost_ray.predict(booster, xgboost_ray.RayDMatrix(x), ray_params, **kwargs)
        expected = booster.predict(xgb.DMatrix(x), **kwargs)
        assert ours.shape == expected.shape, kwargs
        np.testing.assert_allclose(ours, expected, rtol=1e-6, err_msg=str(kwargs))
