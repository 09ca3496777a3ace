"""One side of xgboost_vs_peers.py, in a fresh process:
``xgboost_runner.py SIDE ROWS ROUNDS PREDICTIONS.npy`` with SIDE in unipar (default actors:
one per node, all its CPUs), unipar2 (2 actors), trainer (Ray Train's XGBoostTrainer, 2
workers), single (xgboost, all CPUs) and collective2 (plain xgboost, 2 processes joined by
its own collective, each training on the rows unipar's 2 actors get: the reference a
2-actor booster must equal, since distributed ``hist`` merges per-worker quantile sketches
and so grows other trees than one process does).

Makes the data first, then times everything from framework import to a trained booster
(Ray's start, or joining the cluster named by RAY_ADDRESS, included) and prints ``RESULT
seconds rounds``; then, untimed, writes the booster's predictions on held-out rows (drawn
apart from the training rows) to PREDICTIONS.npy, for the caller to compare."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 6, "seed": 0}
SMALL = 569  # scikit-learn's breast cancer data set
HELD_OUT = 10_000


def make_data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    if rows == SMALL:
        from sklearn.datasets import load_breast_cancer

        return load_breast_cancer(return_X_y=True)
    return synthetic(rows, seed=0)


def synthetic(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 30)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.normal(size=rows) > 0).astype(np.float32)
    return x, y


def held_out(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows to compare boosters on: fresh draws of the synthetic data (seed 1), never seen
    in training; for the small case the breast cancer rows themselves (the set has no
    others; what is compared is the models, not their generalisation)."""
    if rows == SMALL:
        return make_data(rows)
    return synthetic(HELD_OUT, seed=1)


def run_unipar(x, y, rounds, num_actors=0):  # type: ignore[no-untyped-def]
    from unipar.xgboost import RayDMatrix, RayParams, train

    ray_params = RayParams(num_actors=num_actors)
    return train(PARAMS, RayDMatrix(x, y), rounds, ray_params=ray_params)


def run_unipar2(x, y, rounds):  # type: ignore[no-untyped-def]
    return run_unipar(x, y, rounds, num_actors=2)


def run_single(x, y, rounds):  # type: ignore[no-untyped-def]
    import xgboost as xgb

    return xgb.train({**PARAMS, "nthread": os.cpu_count()}, xgb.DMatrix(x, y), rounds)


def run_trainer(x, y, rounds):  # type: ignore[no-untyped-def]
    import logging

    import pandas as pd
    import ray
    import ray.data
    import ray.train
    import xgboost as xgb
    from ray.train import ScalingConfig
    from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(y=y)

    def per_worker(config: dict) -> None:
        shard = ray.train.get_dataset_shard("train").materialize().to_pandas()
        dtrain = xgb.DMatrix(shard.drop(columns="y"), label=shard["y"])
        xgb.train({**PARAMS, "nthread": 1}, dtrain, rounds, callbacks=[RayTrainReportCallback()])

    trainer = XGBoostTrainer(
        per_worker,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        datasets={"train": ray.data.from_pandas(frame)},
    )
    result = trainer.fit()
    return RayTrainReportCallback.get_model(result.checkpoint)


def _collective_worker(args, x, y, rounds, out) -> None:  # type: ignore[no-untyped-def]
    import xgboost as xgb
    from xgboost import collective

    with collective.CommunicatorContext(**args):
        rank = collective.get_rank()
        # unipar's default sharding (INTERLEAVED): shard i holds rows i, i + n, ...
        shard = slice(rank, None, collective.get_world_size())
        booster = xgb.train({**PARAMS, "nthread": 1}, xgb.DMatrix(x[shard], y[shard]), rounds)
        if rank == 0:
            out.put(bytes(booster.save_raw()))


def run_collective2(x, y, rounds):  # type: ignore[no-untyped-def]
    import multiprocessing

    import xgboost as xgb
    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(n_workers=2, host_ip="127.0.0.1")
    tracker.start()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_collective_worker,
                               args=(tracker.worker_args(), x, y, rounds, out))
               for _ in range(2)]
    for w in workers:
        w.start()
    raw = out.get(timeout=3600)
    for w in workers:
        w.join()
    tracker.wait_for()
    return xgb.Booster(model_file=bytearray(raw))


SIDES = {"unipar": run_unipar, "unipar2": run_unipar2, "single": run_single,
         "trainer": run_trainer, "collective2": run_collective2}


def main(side: str, rows: int, rounds: int, predictions: str) -> None:
    x, y = make_data(rows)
    started = time.perf_counter()
    booster = SIDES[side](x, y, rounds)
    print(f"RESULT {time.perf_counter() - started:.3f} {booster.num_boosted_rounds()}",
          flush=True)
    import xgboost as xgb

    held, _ = held_out(rows)
    names = booster.feature_names  # Ray Train's booster was trained on named columns
    np.save(predictions, booster.predict(xgb.DMatrix(held, feature_names=names)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
