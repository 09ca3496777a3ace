"""Run by test_xgboost_drain.py in its own process (it needs its own Ray): XGBoost on
two fake Ray nodes of one CPU each, two actors, elastic training. After ten rounds one
actor's node is drained through the GCS drain API (as a preemption notice) and removed
a moment later. Prints one JSON line: the rounds collective rank 0 ran, in order, and
the training's outcome."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import ray
import xgboost as xgb
from elastic_cluster_run import _drain
from ray.cluster_utils import Cluster

from unipar.xgboost import RayDMatrix, RayParams, train

ROUNDS = 60


class RecordRounds(xgb.callback.TrainingCallback):
    """Collective rank 0 appends each finished round and its Ray node to ``path``; each
    round takes at least 0.1 s, so the drain lands mid-training."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_iteration(self, model, epoch, evals_log):  # type: ignore[no-untyped-def]
        time.sleep(0.1)
        if xgb.collective.get_rank() == 0:
            with open(self.path, "a") as out:
                done = model.num_boosted_rounds() - 1  # ``epoch`` restarts with each attempt
                out.write(f"{done} {ray.get_runtime_context().get_node_id()}\n")
        return False


def _rounds(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(epoch), node) for epoch, node in (line.split() for line in lines)]


def _preempt(cluster: Cluster, record: Path, done: dict[str, object]) -> None:
    """Once ten rounds are done: drain rank 0's node, then remove it 3 s later."""
    while len(_rounds(record)) < 10:
        time.sleep(0.05)
    node_id = _rounds(record)[-1][1]
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    _drain(cluster.address, node_id)
    done["drained_after"] = len(_rounds(record))
    time.sleep(3.0)
    cluster.remove_node(node)


def main(workdir: str) -> None:
    record = Path(workdir) / "rounds.txt"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False)
    cluster.wait_for_nodes()
    rng = np.random.default_rng(0)
    data = rng.normal(size=(2000, 8))
    label = data @ rng.normal(size=8) + 0.1 * rng.normal(size=2000)
    done: dict[str, object] = {}
    watcher = threading.Thread(target=_preempt, args=(cluster, record, done), daemon=True)
    watcher.start()
    results: dict[str, object] = {}
    try:
        booster = train(
            {"objective": "reg:squarederror", "max_depth": 3},
            RayDMatrix(data, label),
            num_boost_round=ROUNDS,
            callbacks=[RecordRounds(str(record))],
            additional_results=results,
            ray_params=RayParams(
                num_actors=2, cpus_per_actor=1, elastic_training=True, max_failed_actors=1
            ),
        )
        watcher.join(timeout=10)
        print(
            json.dumps(
                {
                    "rounds": [epoch for epoch, _ in _rounds(record)],
                    "nodes": len({node for _, node in _rounds(record)}),
                    "boosted": booster.num_boosted_rounds(),
                    "failures": results["failures"],
                    "drained_after": done.get("drained_after"),
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
