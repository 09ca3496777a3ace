"""Run by test_elastic_cluster.py in its own process (it needs its own Ray): three fake
Ray nodes of one CPU each and an elastic data-parallel run on 1..3 workers. While it
trains: a node is removed (3->2), a node is added (2->3), and a node is drained through
the GCS drain API that the autoscaler and ``ray drain-node`` use (3->2 at a step
boundary). Prints one JSON line with what happened.

Each sample loads slowly (10 ms), so that a step outlasts a joining worker's start, until
the third resize: then the script writes ``fast_once`` and the remaining steps (about
300 of the 400) run at their own speed, not 60 ms each."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from unipar import Callback, fit
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.runtime.metrics import read_events
from unipar.testing import SlowRegression, mse_loss

STEPS = 400


def _job(fast_once: Path) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(
        name="elastic-cluster",
        model=functools.partial(MLP, config),
        dataset=functools.partial(SlowRegression, 4096, 16, 4, 0.01,
                                  fast_once=str(fast_once)),
        global_batch_size=12,
        steps=STEPS,
        optimizer=OptimizerSpec(lr=1e-2),
        loss=mse_loss,
    )


def _drain(address: str, node_id: str) -> None:
    from ray.core.generated import autoscaler_pb2

    client = ray._raylet.GcsClient(address=address)
    accepted, message = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "preempted by the test",
        int(time.time() * 1000) + 60_000,
    )
    assert accepted, message


class Script(Callback):
    """Remove a worker's node, then add a node, then drain a worker's node, each once
    the previous change has been taken in."""

    def __init__(self, cluster: Cluster, fast_once: Path) -> None:
        self.cluster, self.fast_once = cluster, fast_once
        self.stage = 0
        self.resizes = 0
        self.last_step = 0
        self.done_at: list[int] = []

    def on_resize(self, event):  # type: ignore[no-untyped-def]
        self.resizes += 1
        if self.resizes == 3:  # the drain taken in: the scenario is over
            self.fast_once.touch()

    def _worker_node(self, workers):  # type: ignore[no-untyped-def]
        head = self.cluster.head_node.node_id
        ids = {w.node_id for w in workers} - {head}
        return next(n for n in self.cluster.worker_nodes if n.node_id in ids)

    def on_step(self, metrics, workers):  # type: ignore[no-untyped-def]
        self.last_step = metrics.step
        if self.stage != self.resizes or metrics.step < 15 * (self.stage + 1):
            return
        if self.stage == 0 and len(workers) == 3:
            self.cluster.remove_node(self._worker_node(workers))
        elif self.stage == 1:
            self.cluster.add_node(num_cpus=1)
        elif self.stage == 2 and len(workers) == 3:
            _drain(self.cluster.address, self._worker_node(workers).node_id)
        else:
            return
        self.done_at.append(metrics.step)
        self.stage += 1


def main(run_dir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False)
    cluster.wait_for_nodes()
    fast_once = Path(run_dir) / "scenario-over"
    script = Script(cluster, fast_once)
    try:
        result = fit(
            _job(fast_once),
            workers=(1, 3),
            run_dir=run_dir,
            progress=False,
            callbacks=[script],
            checkpoint_every=10_000,
        )
        records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
        steps = [r["step"] for r in records if "event" not in r]
        print(
            json.dumps(
                {
                    "changes_at": script.done_at,
                    "resizes": [
                        [e["old"], e["new"], e["step"], e["reason"]]
                        for e in read_events(result.metrics_path)
                    ],
                    "steps": steps,
                    "history": [m.step for m in result.history],
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
