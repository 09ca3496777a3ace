"""RayDMatrix data sources beyond arrays and files: DataFrames in Ray's object store,
partitioned data (``__partitioned__``), a folder of Parquet files, rows unsorted by
query id; and ``_remote`` (the driver part in a task). Each trains for real on 2 actors
and predicts in the data's row order. About 20 s on 2 cores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import ray
import xgboost as xgb
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import log_loss

from unipar.xgboost import RayDMatrix, RayParams, predict, train
from unipar.xgboost.sources import SourceKind

PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "seed": 0, "max_depth": 3}
TWO = RayParams(num_actors=2, cpus_per_actor=1)
# Other rows per actor than one process sees: quality within 2% of single-process xgboost.
QUALITY = 0.02


@pytest.fixture(scope="module")
def frame():
    x, y = load_breast_cancer(return_X_y=True)
    return pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(y=y)


def _split(frame: pd.DataFrame, parts: int) -> list[pd.DataFrame]:
    return [frame.iloc[rows] for rows in np.array_split(np.arange(len(frame)), parts)]


def _check(booster: xgb.Booster, frame: pd.DataFrame, data: RayDMatrix) -> None:
    """Training quality near single-process xgboost's, and predictions over ``data`` in
    the rows' order."""
    features = xgb.DMatrix(frame.drop(columns="y"))
    single = xgb.train(PARAMS, xgb.DMatrix(frame.drop(columns="y"), frame["y"]), 5)
    ours, reference = log_loss(frame["y"], booster.predict(features)), log_loss(
        frame["y"], single.predict(features)
    )
    assert abs(ours / reference - 1) <= QUALITY
    got = predict(booster, data, ray_params=TWO)
    np.testing.assert_allclose(got, booster.predict(features), rtol=1e-6)


def test_dataframes_in_the_object_store(ray_cluster, frame):
    refs = [ray.put(part) for part in _split(frame, 4)]
    for distributed in (False, True):  # gathered and split by rows; or read by the actors
        data = RayDMatrix(refs, label="y", distributed=distributed)
        assert data.kind is SourceKind.OBJECT_REFS and data.distributed == distributed
        extra = {}
        booster = train(PARAMS, data, 5, ray_params=TWO, additional_results=extra)
        assert extra["total_n"] == len(frame)
        _check(booster, frame, data)


class Partitioned:
    """Data offering the partitioned protocol, its partitions in the object store."""

    def __init__(self, parts: list[pd.DataFrame]) -> None:
        here = ray.util.get_node_ip_address()
        starts = np.cumsum([0, *[len(p) for p in parts]])
        self.__partitioned__ = {
            "shape": (int(starts[-1]), parts[0].shape[1]),
            "partition_tiling": (len(parts), 1),
            "get": ray.get,
            "partitions": {
                (i, 0): {
                    "start": (int(starts[i]), 0),
                    "shape": part.shape,
                    "data": ray.put(part),
                    "location": [here],
                }
                for i, part in enumerate(parts)
            },
        }


def test_partitioned_data_goes_whole_to_the_actors(ray_cluster, frame):
    data = RayDMatrix(Partitioned(_split(frame, 5)), label="y")
    assert data.distributed and data.kind is SourceKind.PARTITIONED
    extra = {}
    booster = train(PARAMS, data, 5, ray_params=TWO, additional_results=extra)
    assert extra["total_n"] == len(frame)
    _check(booster, frame, data)


def test_a_folder_of_parquet_files(ray_cluster, frame, tmp_path):
    for i, part in enumerate(_split(frame, 3)):
        (tmp_path / f"day={i}").mkdir()
        part.to_parquet(tmp_path / f"day={i}" / "part.parquet")
    data = RayDMatrix(str(tmp_path), label="y", distributed=True)
    assert len(data.parts) == 3
    booster = train(PARAMS, data, 5, ray_params=TWO)
    _check(booster, frame, data)


def test_unsorted_queries_are_sorted_and_predictions_come_back_in_order(ray_cluster, frame):
    rng = np.random.default_rng(0)
    qid = rng.integers(0, 20, size=len(frame))  # unsorted
    x, y = frame.drop(columns="y").to_numpy(), frame["y"].to_numpy()
    params = {**PARAMS, "objective": "rank:pairwise"}
    booster = train(params, RayDMatrix(x, y, qid=qid), 5, ray_params=TWO)
    got = predict(booster, RayDMatrix(x, qid=qid), ray_params=TWO)
    np.testing.assert_allclose(got, booster.predict(xgb.DMatrix(x)), rtol=1e-6)
    shard = RayDMatrix(x, y, qid=qid).get_data(rank=0, num_actors=2)
    assert shard["qid"].is_monotonic_increasing  # XGBoost-Ray's view of a shard


def test_remote_runs_the_driver_part_in_a_task(ray_cluster, frame):
    data = RayDMatrix(frame, label="y")
    here, there = {}, {}
    local = train(PARAMS, data, 5, evals=[(data, "train")], evals_result=here, ray_params=TWO)
    remote = train(
        PARAMS, data, 5, evals=[(data, "train")], evals_result=there, ray_params=TWO, _remote=True
    )
    assert remote.get_dump() == local.get_dump() and there == here
    got = predict(remote, RayDMatrix(frame.drop(columns="y")), ray_params=TWO, _remote=True)
    np.testing.assert_allclose(got, local.predict(xgb.DMatrix(frame.drop(columns="y"))))
