"""unipar.xgboost inside Ray Tune trials: each round's metrics reach Tune, the model
arrives as a Tune checkpoint, Tune picks the better configuration, and the actors train
in the trial's resources (``RayParams.get_tune_resources``, as with XGBoost-Ray)."""

from __future__ import annotations

import sys

import ray.cloudpickle
from sklearn.datasets import load_breast_cancer

from unipar.xgboost import RayDMatrix, RayParams, TuneReportCheckpointCallback, train
from unipar.xgboost.tune import load_model

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the trainable runs remotely

ROUNDS = 12
# The trial reserves the test cluster's 4 CPUs for its actors: actors that asked for
# resources of their own would wait for them forever (and fail after 60 s).
RAY_PARAMS = RayParams(num_actors=2, cpus_per_actor=2)


def trainable(config):
    x, y = load_breast_cancer(return_X_y=True)
    data = RayDMatrix(x, y)
    params = {
        "objective": "binary:logistic",
        "eval_metric": ["logloss"],
        "max_depth": config["max_depth"],
        "seed": 0,
    }
    train(
        params,
        data,
        ROUNDS,
        evals=[(data, "train")],
        ray_params=RayParams(),  # the defaults take the trial's bundles
        callbacks=[TuneReportCheckpointCallback(frequency=5)],
    )


def test_tune_trials_report_rounds_and_checkpoints(ray_cluster, tmp_path):
    from ray import tune

    tuner = tune.Tuner(
        tune.with_resources(trainable, RAY_PARAMS.get_tune_resources()),
        param_space={"max_depth": tune.grid_search([1, 4])},
        tune_config=tune.TuneConfig(metric="train-logloss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    results = tuner.fit()
    assert not results.errors
    for result in results:
        history = result.metrics_dataframe
        assert list(history["training_iteration"]) == list(range(1, ROUNDS + 1))
        assert history["train-logloss"].is_monotonic_decreasing
        assert load_model(result.checkpoint).num_boosted_rounds() == ROUNDS
    assert results.get_best_result().config == {"max_depth": 4}
