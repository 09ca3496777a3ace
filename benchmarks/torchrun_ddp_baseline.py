"""Plain PyTorch DDP under ``torchrun``: the baseline of ddp_vs_torchrun.py.

Same model, data order, optimizer, schedule and clipping as unipar's run, one thread per
process. Rank 0 writes the wall-clock end time of every step and its loss (the mean over
the ranks, as unipar reports it) to the JSON file given.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import default_collate
from workload import job as workload_job

from unipar.data.sampler import GlobalBatchSampler


def main(steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = dataclasses.replace(workload_job(), steps=steps)
    torch.manual_seed(job.seed)
    model = DistributedDataParallel(job.model())
    optimizer = job.build_optimizer(model.parameters())
    base_lr = optimizer.param_groups[0]["lr"]
    dataset = job.dataset()
    sampler = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed)
    ends, losses = [], []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = base_lr * job.lr_schedule.multiplier(step, steps)
        inputs, targets = default_collate(
            [dataset[int(i)] for i in sampler.shard_indices(step, rank, world)]
        )
        loss = job.loss(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # every rank's loss on its half, averaged: the batch's loss
        losses.append(mean.item() / world)
        ends.append(time.time())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_ends": ends, "losses": losses}, f)
    # neither rank leaves while the other still talks to it (one rank aborted at exit,
    # "terminate called without an active exception", in all 3 runs of one invocation)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
