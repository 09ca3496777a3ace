"""Diagnostic for ddp_vs_torchrun.py: unipar's own Trainer (the code each Ray worker
runs) launched by ``torchrun`` instead of Ray. Same JSON output as the baseline script,
so the three can be compared: plain DDP, Trainer under torchrun, Trainer under Ray."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from workload import job as workload_job

from unipar.plan import Plan
from unipar.runtime.step_records import CheckpointPolicy
from unipar.runtime.trainer import Trainer


def main(steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = dataclasses.replace(workload_job(), steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            job,
            Plan.data_parallel(world, job.global_batch_size),
            rank=rank,
            world_size=world,
            device=torch.device("cpu"),
            checkpoints=CheckpointPolicy(Path(tmp), 10**9, 1),
        )
        trainer.setup(None)
        ends = []
        for step in range(steps):
            trainer.train_step(step)
            ends.append(time.time())
    if rank == 0:
        Path(out).write_text(json.dumps({"step_ends": ends}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
