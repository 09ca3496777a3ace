"""A click-through-rate model on parameter servers: a 1M-row embedding table and a small
MLP, synthetic clicks with Zipf-distributed ids, 2 workers and 2 servers.

First the planner prices a parameter server against an all-reduce for this model and
says why it picks one; then the model trains on servers (SSP, bound 2, Adagrad on the
servers, snapshots every 20 clocks) and prints the loss.

    python examples/ctr_model.py
"""

from __future__ import annotations

import functools
import logging
import tempfile

import ray

from unipar.models.ctr import CTRModel, ZipfClicks, ctr_loss
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.plan.sync_cost import Links, SparseWorkload, choose_grad_sync
from unipar.ps import Consistency, ConsistencySpec
from unipar.runtime.servers.train import PSConfig, train

ROWS, DIM, FIELDS, BATCH, WORKERS, STEPS = 1_000_000, 8, 4, 256, 2, 60


def main() -> None:
    data = ZipfClicks(ROWS, batch=BATCH, fields=FIELDS)
    touched = len(data(0, 1)[0].unique()) / ROWS
    workload = SparseWorkload(
        table_rows=ROWS,
        dim=DIM,
        dense_params=FIELDS * DIM * 32 + 32 + 33,
        touched_fraction=touched,
        workers=WORKERS,
        servers=2,
        serve_dense=True,
        staleness=2,
    )
    links = Links(all_reduce_bw=1e9, worker_bw=0.3e9, server_bw=0.3e9)  # this machine, roughly
    print(choose_grad_sync(workload, links).reason)

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    config = PSConfig(
        num_servers=2,
        optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05),
        consistency=ConsistencySpec(Consistency.SSP, staleness=2),
        snapshot_dir=tempfile.mkdtemp(prefix="ctr-ps-"),
        snapshot_every=20,
    )
    factory = functools.partial(CTRModel, ROWS, DIM, FIELDS, seed=0)
    result = train(factory, data, ctr_loss, workers=WORKERS, steps=STEPS, config=config)
    first, last = result.losses[0][:5], result.losses[0][-5:]
    print(
        f"loss {sum(first) / 5:.4f} -> {sum(last) / 5:.4f} in {result.steps} worker-steps, "
        f"{result.wall_s:.1f} s; {(result.bytes_pulled + result.bytes_pushed) / 2**20:.1f} MiB "
        f"moved (an all-reduce of the table would move {ROWS * DIM * 4 / 2**20:.0f} MiB a step)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
