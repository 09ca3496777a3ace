"""The Ray actor that hosts one :class:`~unipar.runtime.trainer.Trainer`.

``train`` is a Ray generator: each step's report streams to the controller as the step
ends, so progress never waits for a collective and training never waits for the
controller. The actor is not threaded: training runs on the worker's main thread
(measured: a threaded actor, training in a pool thread, ran 2-3% fewer steps/s).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_cluster.supervisor import describe_process
from unipar.runtime.heap import settle_heap
from unipar.runtime.tracing import TraceBatch
from unipar.runtime.trainer import CheckpointPolicy, StepReport, Trainer, TrainOutcome


class TrainWorker:
    def __init__(
        self,
        job: Job,
        plan: Plan,
        *,
        rank: int,
        world_size: int,
        threads: int,
        use_gpu: bool,
        checkpoints: CheckpointPolicy,
    ) -> None:
        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.use_gpu = use_gpu
        device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.trainer = Trainer(
            job, plan, rank=rank, world_size=world_size, device=device, checkpoints=checkpoints
        )

    def describe(self) -> tuple[int, str, str]:
        """(process id, node IP, Ray node id) of this worker."""
        return describe_process()

    def reserve_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def setup(
        self, master_address: str, master_port: int, resume_from: Path | None, timeout_s: float
    ) -> int:
        if self.world_size > 1:
            dist.init_process_group(
                backend="nccl" if self.use_gpu else "gloo",
                init_method=f"tcp://{master_address}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=timeout_s),
            )
        start = self.trainer.setup(resume_from)
        settle_heap()
        return start

    def train(
        self, trace_steps: int | None = None
    ) -> Iterator[StepReport | TraceBatch | TrainOutcome]:
        """Each step's report as the step ends (and, tracing the last ``trace_steps``,
        this rank's records after them), then the outcome."""
        self.trainer.trace(trace_steps)
        try:
            outcome = yield from self.trainer.train()
            yield outcome
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
