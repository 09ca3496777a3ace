"""The shared cluster's scheduler asks Ray's autoscaler for a node, grows a job onto it,
and lets the node go when the job ends, on a local autoscaling cluster.

Ray's fake multi-node provider (``ray.cluster_utils.AutoscalingCluster``, the one Ray's
own autoscaler tests use) runs a real autoscaler whose "nodes" are raylets on this
machine: a head of 2 CPUs, and up to one node of 2 CPUs added on demand. One job that
can use 1 to 4 workers is submitted; it starts on the head's 2; the scheduler's goodput
policy finds 4 useful and asks ``ray.autoscaler.sdk.request_resources`` for them; the
node comes up and the job grows onto it live (workers on two nodes); when the job ends
the request is withdrawn and the autoscaler removes the idle node. Its checks raise if
any of that does not happen. Note: starting the cluster runs ``ray stop --force``, which
stops every Ray process on this machine.

    python examples/shared_cluster_autoscaling.py
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import AutoscalingCluster

from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.service import client
from unipar.service.state import JobState
from unipar.testing import SlowRegression, mse_loss

HEAD_CPUS, NODE_CPUS = 2, 2


class LocalAutoscalingCluster(AutoscalingCluster):
    """Ray's local autoscaling cluster with its whole configuration here (Ray's wheel
    leaves out the example file its generator reads)."""

    def _generate_config(  # type: ignore[no-untyped-def]
        self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs
    ) -> dict[str, Any]:
        types = dict(worker_node_types)
        types["ray.head.default"] = {"resources": dict(head_resources), "node_config": {},
                                     "max_workers": 0}
        config: dict[str, Any] = {
            "cluster_name": "unipar-local", "max_workers": 4,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "available_node_types": types, "head_node_type": "ray.head.default",
            "upscaling_speed": 1.0, "idle_timeout_minutes": 0.1,
            "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
            "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        }
        for commands in ("initialization_commands", "setup_commands", "head_setup_commands",
                         "worker_setup_commands", "head_start_ray_commands",
                         "worker_start_ray_commands"):
            config[commands] = []
        return {**config, **config_kwargs}


def job() -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(name="grows-onto-a-new-node", model=functools.partial(MLP, config),
               dataset=functools.partial(SlowRegression, 512, 16, 4, 0.01), global_batch_size=8,
               steps=600, optimizer=OptimizerSpec(lr=1e-2), loss=mse_loss)


def cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 0.0))


def main() -> None:
    cluster = LocalAutoscalingCluster(
        head_resources={"CPU": HEAD_CPUS},
        worker_node_types={"cpu_node": {"resources": {"CPU": NODE_CPUS}, "node_config": {},
                                        "min_workers": 0, "max_workers": 1}},
    )
    cluster.start()
    try:
        ray.init("auto")
        with tempfile.TemporaryDirectory() as tmp:
            client.up(state_dir=Path(tmp), policy="unipar", interval_s=1.0)
            began = time.time()
            handle = client.submit(job(), workers=(1, 4), checkpoint_every=100_000)
            most_cpus = cpus()
            while True:
                row = handle.status()
                most_cpus = max(most_cpus, cpus())
                print(f"{time.time() - began:5.1f} s  cluster CPUs {cpus():.0f}  job "
                      f"{row.state.value}, workers {row.workers}/{row.target}, step "
                      f"{row.step}/{row.steps}", flush=True)
                if row.state.ended:
                    break
                if time.time() - began > 300:
                    raise SystemExit("the job has not ended in 300 s; `unipar logs` shows why")
                time.sleep(2.0)
            row = handle.wait(timeout_s=60)
            log = client.logs(row.id)
            print(log)
            ended = time.time()
            while cpus() > HEAD_CPUS and time.time() - ended < 60:
                time.sleep(1.0)
            released_s = time.time() - ended
            client.down()
        resizes = [line for line in log.splitlines() if "[scheduler] resize 2\u21924" in line]
        if row.state is not JobState.DONE or most_cpus < HEAD_CPUS + NODE_CPUS or not resizes:
            raise SystemExit(f"the job did not grow onto an added node: {row.state.value}, "
                             f"at most {most_cpus:.0f} CPUs, resizes {row.restarts}")
        if cpus() > HEAD_CPUS:
            raise SystemExit(f"the added node was not released: {cpus():.0f} CPUs")
        print(f"grown onto the added node ({resizes[0].split('resize ')[-1]}); the node was "
              f"released {released_s:.0f} s after the job ended")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
