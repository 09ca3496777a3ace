"""Distributed XGBoost: quality parity with single-process xgboost, real actor kills in
both fault-tolerance modes, file inputs, prediction order, and bad input."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import ray.cloudpickle
import xgboost as xgb
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import log_loss

from unipar import ConfigError, ResourceError
from unipar.xgboost import (
    DistributedCallback,
    RayDMatrix,
    RayParams,
    RayXGBoostTrainingError,
    predict,
    train,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # callbacks run in actors

PARAMS = {
    "objective": "binary:logistic",
    "eval_metric": ["logloss"],
    "tree_method": "hist",
    "seed": 0,
    "max_depth": 4,
}
# Distributed hist merges the actors' quantile sketches; on these data it reproduces the
# single-process model exactly (measured: identical predictions). Allowed: 1e-6 absolute.
QUALITY_TOLERANCE = 1e-6
# After a failure some rounds are retrained from a checkpoint; in elastic mode some rounds
# also see only part of the data. Allowed: log-loss within 10% of the clean run.
FAULT_TOLERANCE = 0.10


@pytest.fixture(scope="module")
def cancer():
    return load_breast_cancer(return_X_y=True)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40_000, 20))
    y = (x[:, 0] + 0.5 * x[:, 1] ** 2 + rng.normal(scale=0.5, size=len(x)) > 0.5).astype(float)
    return x, y


class RefusesToStart(DistributedCallback):
    def on_init(self, actor):  # type: ignore[no-untyped-def]
        raise ValueError("this callback refuses to start")


def test_an_actor_failing_to_start_names_its_error(ray_cluster, cancer):
    """An actor whose constructor raises: the driver's error holds the actor's (it used
    to say the actor did not start within 300 s, after at most a second)."""
    x, y = cancer
    rp = RayParams(num_actors=2, distributed_callbacks=[RefusesToStart()])
    with pytest.raises(RayXGBoostTrainingError, match="this callback refuses to start"):
        train(PARAMS, RayDMatrix(x, y), 2, ray_params=rp)


@pytest.mark.parametrize("actors", [2, 1])
def test_early_stopping_ends_training_as_in_xgboost(ray_cluster, cancer, actors):
    """Training stopped by the job's own callbacks (early stopping) ends there, with the
    rounds, best iteration and evaluation log of single-process xgboost."""
    x, y = cancer
    fit, held = slice(0, 400), slice(400, None)
    params = {**PARAMS, "max_depth": 6, "eta": 0.5}
    single_log: dict = {}
    single = xgb.train(
        params,
        xgb.DMatrix(x[fit], y[fit]),
        200,
        evals=[(xgb.DMatrix(x[held], y[held]), "valid")],
        early_stopping_rounds=3,
        evals_result=single_log,
        verbose_eval=False,
    )
    assert single.num_boosted_rounds() < 50  # it does stop early on these data
    ours_log: dict = {}
    booster = train(
        params,
        RayDMatrix(x[fit], y[fit]),
        200,
        evals=[(RayDMatrix(x[held], y[held]), "valid")],
        early_stopping_rounds=3,
        evals_result=ours_log,
        ray_params=RayParams(num_actors=actors),
    )
    assert booster.num_boosted_rounds() == single.num_boosted_rounds()
    assert booster.best_iteration == single.best_iteration
    np.testing.assert_allclose(
        ours_log["valid"]["logloss"], single_log["valid"]["logloss"], atol=QUALITY_TOLERANCE
    )


@pytest.mark.parametrize("actors", [2, 1])  # one actor trains outside any collective
def test_same_quality_as_single_process(ray_cluster, cancer, actors):
    x, y = cancer
    result, extra = {}, {}
    data = RayDMatrix(x, y)
    booster = train(
        PARAMS,
        data,
        20,
        evals=[(data, "train")],
        evals_result=result,
        additional_results=extra,
        ray_params=RayParams(num_actors=actors),
    )
    single = xgb.train(PARAMS, xgb.DMatrix(x, y), 20)
    ours = predict(booster, RayDMatrix(x), ray_params=RayParams(num_actors=actors))
    reference = single.predict(xgb.DMatrix(x))
    assert booster.num_boosted_rounds() == 20
    assert abs(log_loss(y, ours) - log_loss(y, reference)) <= QUALITY_TOLERANCE
    np.testing.assert_allclose(ours, reference, atol=QUALITY_TOLERANCE)
    assert len(result["train"]["logloss"]) == 20
    assert extra["total_n"] == len(x) and extra["num_actors"] == actors


class KillOnce(xgb.callback.TrainingCallback):
    """SIGKILL this actor's own process after round ``at`` on collective ``rank``, once."""

    def __init__(self, at: int, marker: str, rank: int = 1) -> None:
        self.at, self.marker, self.rank = at, marker, rank

    def after_iteration(self, model, epoch, evals_log):
        from xgboost import collective

        due = model.num_boosted_rounds() >= self.at and collective.get_rank() == self.rank
        if due and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return False


@pytest.mark.parametrize("mode", ["restart", "elastic"])
def test_killed_actor(ray_cluster, synthetic, tmp_path, mode):
    x, y = synthetic
    rounds = 40
    clean = xgb.train(PARAMS, xgb.DMatrix(x, y), rounds)
    marker = str(tmp_path / "killed")
    ray_params = (
        RayParams(num_actors=2, max_actor_restarts=1, checkpoint_frequency=5)
        if mode == "restart"
        else RayParams(
            num_actors=2, elastic_training=True, max_failed_actors=1, checkpoint_frequency=5
        )
    )
    extra = {}
    booster = train(
        PARAMS,
        RayDMatrix(x, y),
        rounds,
        ray_params=ray_params,
        callbacks=[KillOnce(12, marker)],
        additional_results=extra,
    )
    assert Path(marker).exists(), "the actor was never killed"
    assert extra["failures"] == 1
    # restart mode replaces the actor once; elastic mode goes on without a restart
    assert extra["restarts"] == (1 if mode == "restart" else 0)
    assert booster.num_boosted_rounds() == rounds
    ours = log_loss(y, booster.predict(xgb.DMatrix(x)))
    reference = log_loss(y, clean.predict(xgb.DMatrix(x)))
    assert abs(ours / reference - 1) <= FAULT_TOLERANCE


class KillWhileLoading:
    """A DistributedCallback that SIGKILLs the actors of data shards ``ranks`` as they
    start loading their data, once per shard and marker file."""

    def __init__(self, marker: str, ranks: tuple[int, ...] = (1,)) -> None:
        self.marker, self.ranks = marker, ranks

    def on_init(self, actor):
        pass

    def before_data_loading(self, actor, data):
        marker = f"{self.marker}-{actor.rank}"
        if actor.rank in self.ranks and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)

    def after_data_loading(self, actor, data):
        pass

    def before_train(self, actor):
        pass

    def after_train(self, actor, result):
        pass

    def before_predict(self, actor):
        pass

    def after_predict(self, actor, predictions):
        pass


def test_an_actor_killed_while_loading_is_replaced_when_restarts_are_allowed(
    ray_cluster, cancer, tmp_path
):
    from unipar.xgboost import DistributedCallback

    x, y = cancer
    kill = type("Kill", (KillWhileLoading, DistributedCallback), {})
    extra = {}
    ray_params = RayParams(
        num_actors=2, max_actor_restarts=1, distributed_callbacks=[kill(str(tmp_path / "a"))]
    )
    booster = train(PARAMS, RayDMatrix(x, y), 10, ray_params=ray_params,
                    additional_results=extra)
    assert (tmp_path / "a-1").exists(), "the actor was never killed"
    assert booster.num_boosted_rounds() == 10
    assert extra["failures"] == 1 and extra["restarts"] == 1 and extra["total_n"] == len(x)
    no_restarts = RayParams(
        num_actors=2, max_actor_restarts=0, distributed_callbacks=[kill(str(tmp_path / "b"))]
    )
    with pytest.raises(RayXGBoostTrainingError, match=r"shards \[1\] died while loading"):
        train(PARAMS, RayDMatrix(x, y), 10, ray_params=no_restarts)
    # elastic training counts actors against max_failed_actors, not restarts
    both = RayParams(num_actors=2, elastic_training=True, max_failed_actors=1,
                     distributed_callbacks=[kill(str(tmp_path / "c"), ranks=(0, 1))])
    with pytest.raises(RayXGBoostTrainingError, match="2 actors lost, more than "
                       "max_failed_actors=1"):
        train(PARAMS, RayDMatrix(x, y), 10, ray_params=both)


def test_elastic_training_that_loses_its_only_actor_waits_for_the_replacement(
    ray_cluster, synthetic, tmp_path
):
    x, y = synthetic
    marker = str(tmp_path / "killed")
    extra = {}
    ray_params = RayParams(
        num_actors=1, elastic_training=True, max_failed_actors=1, checkpoint_frequency=5
    )
    booster = train(
        PARAMS,
        RayDMatrix(x, y),
        20,
        ray_params=ray_params,
        callbacks=[KillOnce(8, marker, rank=0)],
        additional_results=extra,
    )
    assert Path(marker).exists(), "the actor was never killed"
    assert extra["failures"] == 1 and extra["num_actors"] == 1
    assert booster.num_boosted_rounds() == 20


def test_files_are_read_by_their_actors(ray_cluster, cancer, tmp_path):
    import pandas as pd

    x, y = cancer
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(target=y)
    paths = [tmp_path / f"part{i}.{'csv' if i % 2 else 'parquet'}" for i in range(4)]
    csv = [p for p in paths if p.suffix == ".csv"]
    for path, rows in zip(paths, np.array_split(np.arange(len(frame)), 4), strict=True):
        part = frame.iloc[rows]
        part.to_csv(path, index=False) if path.suffix == ".csv" else part.to_parquet(path)
    data = RayDMatrix([str(p) for p in csv], label="target")
    booster = train(PARAMS, data, 10, ray_params=RayParams(num_actors=2))
    parquet = RayDMatrix([str(p) for p in paths if p.suffix == ".parquet"], label="target")
    assert train(PARAMS, parquet, 10, ray_params=RayParams(num_actors=2)).num_boosted_rounds() == 10
    assert booster.feature_names == [f"f{i}" for i in range(x.shape[1])]


def test_predictions_over_files_keep_the_rows_order(ray_cluster, cancer, tmp_path):
    """Five files over two actors (INTERLEAVED: files 0, 2, 4 and 1, 3): the predictions
    come back in the order of the files' rows, not sorted, not grouped by actor."""
    import pandas as pd

    x, y = cancer
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(target=y)
    paths = [str(tmp_path / f"part{i}.csv") for i in range(5)]
    for path, rows in zip(paths, np.array_split(np.arange(len(frame)), 5), strict=True):
        frame.iloc[rows].to_csv(path, index=False)
    booster = xgb.train(PARAMS, xgb.DMatrix(frame.drop(columns="target"), y), 5)
    got = predict(booster, RayDMatrix(paths, label="target"), ray_params=RayParams(num_actors=2))
    expected = booster.predict(xgb.DMatrix(frame.drop(columns="target")))
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_label_missing_or_wrong_length(cancer):
    x, y = cancer
    with pytest.raises(ConfigError, match="training needs labels"):
        train(PARAMS, RayDMatrix(x), 5, ray_params=RayParams(num_actors=2))
    with pytest.raises(ConfigError, match=r"data has 569 rows and label has 100"):
        RayDMatrix(x, y[:100])


def test_settings_that_cannot_train_fail_before_any_actor_starts(ray_cluster, cancer):
    x, y = cancer
    elastic = RayParams(num_actors=2, elastic_training=True)  # XGBoost-Ray accepts this here
    with pytest.raises(ConfigError, match=r"max_failed_actors >= 1.*got max_failed_actors=0"):
        train(PARAMS, RayDMatrix(x, y), 5, ray_params=elastic)
    with pytest.raises(ConfigError, match="tree_method='exact' does not train across actors"):
        train({**PARAMS, "tree_method": "exact"}, RayDMatrix(x, y), 5)
    with pytest.raises(ConfigError, match="2 files cannot feed 3 actors"):
        train(PARAMS, RayDMatrix(["a.csv", "b.csv"], label="y", num_actors=3), 5)


def test_more_actors_than_the_cluster(ray_cluster, cancer):
    x, y = cancer
    with pytest.raises(ResourceError, match=r"needs 8 CPUs \(4 actors x 2 CPU each\).*has 4"):
        train(PARAMS, RayDMatrix(x, y), 5, ray_params=RayParams(num_actors=4, cpus_per_actor=2))


def test_unreadable_files(tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="cannot read PARQUET file"):
        RayDMatrix([str(broken)], label="y")
    with pytest.raises(ConfigError, match="cannot read CSV file"):
        RayDMatrix([str(tmp_path / "missing.csv")], label="y")


def test_feature_names_at_predict_differ(ray_cluster, cancer):
    import pandas as pd

    x, y = cancer
    names = [f"f{i}" for i in range(x.shape[1])]
    booster = train(
        PARAMS, RayDMatrix(pd.DataFrame(x, columns=names), y), 3, ray_params=RayParams(num_actors=2)
    )
    renamed = pd.DataFrame(x, columns=[*names[:-1], "other"])
    with pytest.raises(ConfigError, match=r"missing \['f29'\], unexpected \['other'\]"):
        predict(booster, RayDMatrix(renamed), ray_params=RayParams(num_actors=2))


def test_ray_dataset_blocks_are_split_over_actors(ray_cluster, cancer):
    import pandas as pd
    import ray.data

    x, y = cancer
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(target=y)
    data = RayDMatrix(ray.data.from_pandas(frame), label="target")
    extra = {}
    booster = train(PARAMS, data, 10, ray_params=RayParams(num_actors=2), additional_results=extra)
    assert booster.num_boosted_rounds() == 10
    assert extra["total_n"] == len(frame)
    single = xgb.train(PARAMS, xgb.DMatrix(frame.drop(columns="target"), frame["target"]), 10)
    ours = booster.predict(xgb.DMatrix(frame.drop(columns="target")))
    assert (
        abs(
            log_loss(y, ours)
            - log_loss(y, single.predict(xgb.DMatrix(frame.drop(columns="target"))))
        )
        <= 0.01
    )


class RecordHooks:
    """A DistributedCallback that leaves one file per hook call, named by hook and pid."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _mark(self, hook: str) -> None:
        Path(self.directory, f"{hook}-{os.getpid()}").touch()

    def on_init(self, actor):
        self._mark("on_init")

    def before_data_loading(self, actor, data):
        self._mark("before_data_loading")

    def after_data_loading(self, actor, data):
        self._mark("after_data_loading")

    def before_train(self, actor):
        self._mark("before_train")

    def after_train(self, actor, result):
        self._mark("after_train")

    def before_predict(self, actor):
        self._mark("before_predict")

    def after_predict(self, actor, predictions):
        self._mark("after_predict")


def test_quantile_matrix_and_distributed_callbacks(ray_cluster, cancer, tmp_path):
    from unipar.xgboost import DistributedCallback, RayDeviceQuantileDMatrix

    x, y = cancer
    hooks = type("Hooks", (RecordHooks, DistributedCallback), {})(str(tmp_path))
    ray_params = RayParams(num_actors=2, distributed_callbacks=[hooks])
    booster = train(PARAMS, RayDeviceQuantileDMatrix(x, y), 10, ray_params=ray_params)
    reference = xgb.train(PARAMS, xgb.QuantileDMatrix(x, y), 10)
    assert (
        abs(
            log_loss(y, booster.predict(xgb.DMatrix(x)))
            - log_loss(y, reference.predict(xgb.DMatrix(x)))
        )
        <= QUALITY_TOLERANCE
    )
    predict(booster, RayDMatrix(x), ray_params=ray_params)
    calls = {}
    for marker in tmp_path.iterdir():
        hook, pid = marker.name.rsplit("-", 1)
        calls.setdefault(hook, set()).add(pid)
    trainers = calls["before_train"]
    predictors = calls["before_predict"]
    assert len(trainers) == 2 and len(predictors) == 2 and not trainers & predictors
    assert calls["after_train"] == trainers
    assert calls["after_predict"] == predictors
    # every actor loads its data, for training or prediction (XGBoost-Ray's order)
    for hook in ("on_init", "before_data_loading", "after_data_loading"):
        assert calls[hook] == trainers | predictors, (hook, calls)


def test_combine_data_restores_row_order():
    from unipar.xgboost import RayShardingMode, combine_data

    rows = np.arange(10)
    interleaved = [rows[i::3] for i in range(3)]
    np.testing.assert_array_equal(combine_data(RayShardingMode.INTERLEAVED, interleaved), rows)
    batches = np.array_split(rows, 3)
    np.testing.assert_array_equal(combine_data(RayShardingMode.BATCH, batches), rows)


class SklearnProbe:
    """Records, in each training actor, whether xgboost saw scikit-learn at import and
    whether user code can still import scikit-learn."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def before_train(self, actor):
        import sys

        import xgboost

        seen = xgboost.compat.SKLEARN_INSTALLED
        was_imported = "sklearn" in sys.modules
        from sklearn.metrics import log_loss as user_metric  # a user's callback may do this

        Path(self.directory, f"{seen}-{was_imported}-{callable(user_metric)}").touch()


def test_actors_import_xgboost_without_sklearn(ray_cluster, cancer, tmp_path):
    from unipar.xgboost import DistributedCallback

    x, y = cancer
    probe = type("Probe", (SklearnProbe, DistributedCallback), {})(str(tmp_path))
    ray_params = RayParams(num_actors=2, distributed_callbacks=[probe])
    train(PARAMS, RayDMatrix(x, y), 2, ray_params=ray_params)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["False-False-True"]
