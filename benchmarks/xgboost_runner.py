"""One side of xgboost_vs_peers.py, in a fresh process: ``xgboost_runner.py SIDE CASE``
with SIDE in unipar, trainer, single and CASE in small, large. Makes the data first,
then times everything from framework import to a trained booster (Ray start included),
and prints ``RESULT seconds rounds`` (the actors' log lines share stdout)."""

from __future__ import annotations

import sys
import time

import numpy as np

CASES = {"small": (569, 20), "large": (1_000_000, 50)}
PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 6, "seed": 0}


def make_data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    if rows == 569:
        from sklearn.datasets import load_breast_cancer

        return load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 30)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.normal(size=rows) > 0).astype(np.float32)
    return x, y


def run_unipar(x, y, rounds):  # type: ignore[no-untyped-def]
    from unipar.xgboost import RayDMatrix, RayParams, train

    return train(PARAMS, RayDMatrix(x, y), rounds, ray_params=RayParams(num_actors=2))


def run_single(x, y, rounds):  # type: ignore[no-untyped-def]
    import xgboost as xgb

    return xgb.train({**PARAMS, "nthread": 2}, xgb.DMatrix(x, y), rounds)


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


def main(side: str, case: str) -> None:
    rows, rounds = CASES[case]
    x, y = make_data(rows)
    started = time.perf_counter()
    booster = {"unipar": run_unipar, "single": run_single, "trainer": run_trainer}[side](
        x, y, rounds
    )
    print(f"RESULT {time.perf_counter() - started:.3f} {booster.num_boosted_rounds()}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
