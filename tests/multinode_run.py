"""Run by test_multinode.py in its own process: two Ray nodes of one CPU each, so the
two workers must sit on different nodes. Prints one JSON line with what happened."""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster

from unipar import Callback, fit
from unipar.testing import tiny_gpt_job


class NodesSeen(Callback):
    def __init__(self) -> None:
        self.node_ids: set[str] = set()

    def on_step(self, metrics, workers):
        self.node_ids.update(w.node_id for w in workers)


def main(run_dir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False)
    cluster.wait_for_nodes()
    seen = NodesSeen()
    try:
        result = fit(
            tiny_gpt_job(steps=6), workers=2, run_dir=run_dir, progress=False, callbacks=[seen]
        )
        print(json.dumps({"nodes": len(seen.node_ids), "losses": result.losses}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
