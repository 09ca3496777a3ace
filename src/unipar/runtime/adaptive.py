"""The adaptive batch in a running trainer: gradient norms under any plan, the data by
sample position, the learning-rate factor and the batch choice every K steps.

Norms (McCandlish et al. 2018, App. A.1, see :mod:`unipar.adapt.noise`) need each data
replica's own gradient before it is averaged, and the averaged one:

- DDP: a communication hook sees each bucket of the local gradient before its
  all-reduce (``register_comm_hook``, wrapping PyTorch's ``allreduce_hook``).
- FSDP2 (``fsdp``, or ``dp`` with tensor or pipeline parallelism): a custom
  reduce-scatter (``set_custom_reduce_scatter``) sees the flat local gradient of each
  group once it is copied in (when FSDP allocates the output buffer, before any
  division or communication), whatever the size of the reduce-scatter group.
- One data replica: the first micro-batch's gradient (before the others accumulate)
  against the whole step's; with a single micro-batch, or under a pipeline's schedule
  (its micro-batches are not seen one by one), the gradients of two consecutive steps of
  the same shape, as two replicas' (AdaptDL's estimator does the same: a copy of the
  previous step's gradient is kept, and the parameters moved by one step in between).

Each rank adds the squares of its own part (a tensor-parallel shard, a pipeline stage,
an FSDP flat buffer), one all-reduce of three numbers sums them over the gang (under
plain DDP they ride on the last gradient bucket's all-reduce instead), and the
averaged gradient's parts, replicated over ``dp``, are divided by ``dp``. A parameter
replicated over the tensor-parallel ranks is counted once per rank in both norms alike,
so both measure the gradient in the same (weighted) norm and their ratio, the noise
scale, keeps its meaning. Tied copies across pipeline stages are measured before their
gradients are summed, for the same reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map_only

from unipar.adapt.config import AdaptiveBatch, LRRule
from unipar.adapt.lr import default_rule
from unipar.adapt.noise import NoiseSample
from unipar.adapt.norms import check_mean_loss
from unipar.adapt.state import AdaptState, AdaptStats, BatchShape
from unipar.analysis.meta import BranchesOnMeta
from unipar.data.batch import to_meta
from unipar.data.sampler import SampleStream
from unipar.goodput.table import split_batch
from unipar.job import Job
from unipar.plan import Plan
from unipar.runtime.checkpoint import STATE_FILE

DOUBLE = torch.float64


class _LocalSquares:
    """Σ g² of this rank's local (not yet averaged) gradient, as the hooks see it.

    Under plain DDP (``riders`` set by the trainer) the step's numbers ride on the last
    bucket's all-reduce instead of a collective of their own: each float64 number as two
    float32 (its value and its rounding error), summed over the ranks; ``reduced`` holds
    the sums once DDP's backward is done."""

    def __init__(self) -> None:
        self.total = torch.zeros((), dtype=DOUBLE)
        self.riders: torch.Tensor | None = None  # float64 numbers to sum with the last bucket
        self.reduced: torch.Tensor | None = None

    def add(self, tensor: torch.Tensor) -> None:
        norm = torch.linalg.vector_norm(tensor.detach()).to(DOUBLE)
        self.total = self.total.to(tensor.device) + norm.square()

    def take(self) -> torch.Tensor:
        value, self.total = self.total, torch.zeros((), dtype=DOUBLE)
        return value


def _ddp_hook(squares, bucket):  # type: ignore[no-untyped-def]
    """(No annotations: DDP checks them, and this module's are strings.)"""
    buffer = bucket.buffer()
    squares.add(buffer)
    if squares.riders is None or not bucket.is_last():
        return allreduce_hook(None, bucket)
    # PyTorch's allreduce_hook with the step's numbers appended: the mean of the
    # gradients, the sum of the numbers (split hi + lo so float32 keeps float64's digits)
    riders = torch.cat([squares.riders, squares.total.reshape(1).to(squares.riders)])
    hi = riders.to(buffer.dtype)
    lo = (riders - hi.to(DOUBLE)).to(buffer.dtype)
    size, count = buffer.numel(), riders.numel()
    joined = torch.cat([buffer / dist.get_world_size(), hi.to(buffer.device), lo.to(buffer.device)])
    squares.riders = None

    def unpack(future):  # type: ignore[no-untyped-def]
        out = future.value()[0]
        tail = out[size:].to(DOUBLE)
        squares.reduced = tail[:count] + tail[count:]
        buffer.copy_(out[:size])
        return buffer

    return dist.all_reduce(joined, async_op=True).get_future().then(unpack)


def _reduce_scatter(squares: _LocalSquares) -> Any:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # noqa: PLC0415 (heavy: torch.distributed.fsdp)

    class NormedReduceScatter(ReduceScatter):
        """FSDP2's reduce-scatter that adds the local gradient's squares first: FSDP
        allocates the input, copies the local gradients in, then allocates the output."""

        def __init__(self) -> None:
            self._input: torch.Tensor | None = None

        def allocate(self, size, *, dtype, device):  # type: ignore[no-untyped-def]
            buffer = torch.empty(*size, dtype=dtype, device=device)
            if self._input is None:
                self._input = buffer
            else:
                squares.add(self._input)
                self._input = None
            return buffer

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # type: ignore[no-untyped-def]
            return dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op
            )

    return NormedReduceScatter()


def _install_hooks(parts: list[nn.Module], squares: _LocalSquares) -> None:
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415 (heavy: torch.distributed.fsdp)

    for part in parts:
        if isinstance(part, DistributedDataParallel):
            part.register_comm_hook(squares, _ddp_hook)
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(_reduce_scatter(squares))


def _plain_ddp(parts: list[nn.Module], plan: Plan) -> bool:
    """Data parallelism by DDP alone: one DDP module over the whole world's replicas."""
    mesh = plan.mesh
    return (
        len(parts) == 1
        and isinstance(parts[0], DistributedDataParallel)
        and mesh.pp == 1
        and mesh.tp == 1
        and mesh.dp == mesh.data_replicas
    )


def _local_grads(parts: list[nn.Module]) -> list[torch.Tensor]:
    """This rank's part of the gradients (detached local tensors)."""
    grads = [p.grad for part in parts for p in part.parameters() if p.grad is not None]
    return [(g.to_local() if hasattr(g, "to_local") else g).detach() for g in grads]


def _squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Σ t² over ``tensors`` (a float64 tensor: no wait on the device)."""
    if not tensors:
        return torch.zeros((), dtype=DOUBLE)
    return torch.stack(torch._foreach_norm(tensors)).to(DOUBLE).square().sum()


def _grad_squares(parts: list[nn.Module]) -> torch.Tensor:
    """Σ g² of this rank's part of the gradients (a tensor: no wait on the device)."""
    return _squares(_local_grads(parts))


class AdaptiveStep:
    """One trainer's adaptive batch: which samples each step, the learning-rate factor,
    the norms of each step and the choice of the next batch."""

    def __init__(
        self, job: Job, plan: Plan, *, model: Any, dataset_size: int, state: AdaptState | None
    ) -> None:
        adaptive = job.adaptive
        assert isinstance(adaptive, AdaptiveBatch)
        self.adaptive, self.model = adaptive, model
        self.rule: LRRule = adaptive.lr_rule or default_rule(job.optimizer.kind)  # type: ignore[union-attr]
        replicas = plan.mesh.data_replicas
        self.dp = plan.mesh.dp
        least = adaptive.min_global_batch or job.global_batch_size
        self.fixed = adaptive.max_global_batch == least or plan.mesh.pp > 1
        self.max_micro = adaptive.max_local_batch or max(
            plan.microbatch_size, adaptive.max_global_batch // replicas
        )
        shape = BatchShape(
            plan.microbatch_size,
            job.global_batch_size // (replicas * plan.microbatch_size),
            replicas,
        )
        if least == adaptive.max_global_batch != job.global_batch_size:  # held at another
            micro, accum = split_batch(least, replicas, self.max_micro)
            shape = BatchShape(micro, accum + 1, replicas)
        if state is None:
            state = AdaptState.start(adaptive, job.global_batch_size, shape)
        self.state = state.on_replicas(replicas, self.max_micro)
        self.samples_before = self.state.samples  # the data position before the last step
        self.stream = SampleStream(dataset_size, job.seed)
        self.squares = _LocalSquares()
        self._first: torch.Tensor | None = None
        # one replica without a first micro-batch's gradient: the previous step's (a
        # copy) and the shape it ran at, for the estimate of two consecutive steps
        self._previous: tuple[BatchShape, list[torch.Tensor]] | None = None
        # the step's numbers being summed over the gang, and how to read them: (the batch
        # of each small gradient, their count), None when they give no noise sample
        self._pending: tuple[Any, torch.Tensor, tuple[int, int] | None] | None = None
        self._sample: NoiseSample | None = None
        # the previous step's time here and its shape (all-reduced with the norms); None
        # for a process's first step (it builds and warms up: not a step time to fit)
        self._timed: tuple[BatchShape, float] | None = None
        # A pipeline's stages reduce the sum of the micro-batches' gradients, then divide
        # by their number (``scale_grads``): the local squares are that number² too big.
        self.local_scale = 1.0 / plan.num_microbatches**2 if plan.mesh.pp > 1 else 1.0
        self.one_replica = replicas == 1
        self._steps = 0
        # plain DDP: every rank holds the averaged gradient after backward, and the step's
        # numbers ride on its last bucket (no collective of their own)
        self.ride = not self.one_replica and _plain_ddp(model.parts, plan)
        if not self.one_replica:
            _install_hooks(model.parts, self.squares)

    # -- data --------------------------------------------------------------------------

    def microbatches(self) -> list[torch.Tensor]:
        """This rank's replica's micro-batches of the step at the current position."""
        shape = self.state.shape
        start = self.state.samples + self.model.data_replica * shape.per_replica
        if self.ride:  # the step begins: its numbers wait for DDP's last bucket
            seconds = self._timed[1] if self._timed is not None else 0.0
            self.squares.riders = torch.tensor([seconds], dtype=DOUBLE)
        return list(self.stream.indices(start, shape.per_replica).split(shape.micro))

    # -- learning rate -----------------------------------------------------------------

    def schedule_step(self) -> float:
        """Where the schedule written for M0 stands: scale-invariant steps."""
        return self.state.progress

    def lr_factor(self) -> float:
        return self.state.lr_factor(self.rule)

    # -- norms (called by the model's forward_backward) --------------------------------

    def after_microbatch(self, index: int, count: int) -> None:
        """One replica: the first of ``count`` micro-batches' gradient, unscaled from the
        1/count the mean loss put on it."""
        if self.one_replica and index == 0 and count > 1:
            self._first = _grad_squares(self.model.parts) * (count * count)

    def after_backward(self) -> None:
        """The step's gradients are complete (before clipping and tied-copy sums): start
        summing the norms over the gang (collected at :meth:`finish`, so the all-reduce
        runs beside the optimizer step)."""
        reduced, self.squares.reduced, self.squares.riders = self.squares.reduced, None, None
        shape = self.state.shape
        seconds = self._timed[1] if self._timed is not None else 0.0
        if self.one_replica and self._first is None:
            local, big, read = self._consecutive(shape)
        else:
            big = _grad_squares(self.model.parts)
            if self.one_replica:
                local, read = self._first, (shape.micro, shape.accum)
            else:
                local = self.squares.take() * self.local_scale
                read = (shape.per_replica, shape.replicas)
        if reduced is not None:  # plain DDP: (Σ seconds, Σ local) came with the gradients
            numbers = torch.stack([reduced[1], big * self.dp, reduced[0]])
            self._pending, self._first = (None, numbers, read), None
            return
        numbers = torch.stack([local.to(big.device), big, big.new_tensor(seconds)])
        work = dist.all_reduce(numbers, async_op=True) if dist.is_initialized() else None
        self._pending = (work, numbers, read)
        self._first = None

    def _consecutive(
        self, shape: BatchShape
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int] | None]:
        """(mean of the two squares, square of the mean, how to read them) for this step's
        gradient and the previous step's of the same shape (none: zeros, no sample); the
        gradient is kept for the next step."""
        grads = _local_grads(self.model.parts)
        previous, self._previous = self._previous, (shape, [g.clone() for g in grads])
        if previous is None or previous[0] != shape or len(previous[1]) != len(grads):
            zero = torch.zeros((), dtype=DOUBLE)
            return zero, zero, None
        before = previous[1]
        total = torch._foreach_add(before, grads)
        small = (_squares(before) + _squares(grads)) / 2
        return small, _squares(total) / 4, (shape.per_replica, 2)

    def _collect(self) -> None:
        """The step's norms, summed over the gang: its noise sample and the previous
        step's mean time."""
        work, numbers, read = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        small_sum, big_sum, seconds = numbers.tolist()
        world = dist.get_world_size() if dist.is_initialized() else 1
        if self._timed is not None:
            self._timed = (self._timed[0], seconds / world)
        big = big_sum / self.dp
        sample = None
        if read is not None:  # one replica: one small square (the first micro-batch's) or a mean
            small_batch, count = read
            mean = small_sum if self.one_replica else small_sum / count
            sample = NoiseSample(mean, big, small_batch, count)
        if not all(math.isfinite(v) for v in (small_sum, big_sum)):
            sample = None  # a diverged step says nothing of the noise
        self._sample = sample

    def hold(self, batch: int) -> None:
        """Run global ``batch`` from the next step on, set from outside (the shared
        cluster's scheduler, :meth:`AdaptState.hold`), instead of the job's own choices;
        called on every rank before the same step."""
        if not self.fixed:
            self.state = self.state.hold(batch, self.adaptive, self.max_micro)

    # -- the step's end ----------------------------------------------------------------

    def finish(self, step: int, seconds: float) -> AdaptStats:
        """Move the state past the step (``seconds`` it took here) and, when a choice is
        due (:meth:`AdaptState.due`), choose the batch of the next ones."""
        if self._pending is not None:
            self._collect()
        stats = self.state.stats(self.rule)
        timed, ran = self._timed, self.state.shape
        self.samples_before = self.state.samples
        self.state = self.state.after_step(self._sample, timed)
        self._sample = None
        self._timed = (ran, seconds) if self._steps > 0 else (ran, 0.0)
        self._steps += 1
        if not self.fixed and self.state.due(self.adaptive):
            self.state, _ = self.state.choose(self.adaptive, self.max_micro)
        return stats


def check_adaptive_loss(job: Job, meta_model: nn.Module, inputs: Any, targets: Any) -> None:
    """Refuse, before any worker starts, a loss that is not a mean over samples: the
    output shape of ``meta_model`` (the job's model on the meta device) on two of the
    dataset's samples (``inputs``, ``targets``), random outputs of that shape, and those
    targets (a model that fails here is left to the workers)."""
    generator = torch.Generator().manual_seed(0)
    try:
        with torch.device("meta"), BranchesOnMeta():
            out = job.call(meta_model, to_meta(inputs))
        # random outputs of the model's own type and shapes (a ModelOutput stays one)
        outputs = tree_map_only(
            torch.Tensor, lambda t: torch.randn(t.shape, generator=generator), out
        )
    except Exception:
        return
    check_mean_loss(job.loss, outputs, targets)


def saved_adapt_state(checkpoint: Path | None) -> AdaptState | None:
    """The adaptive batch's state a checkpoint was written with (None: none there)."""
    if checkpoint is None:
        return None
    data = json.loads((Path(checkpoint) / STATE_FILE).read_text()).get("adaptive")
    return None if data is None else AdaptState.from_dict(data)


ADAPT_FILE = "unipar_adapt.json"  # the adaptive state inside an in-memory snapshot


def with_adapt_state(part: Any, adapt: AdaptiveStep | None) -> Any:
    """A snapshot part (:class:`~unipar.runtime.elastic.snapshot.SnapshotPart`) that also holds
    the adaptive batch's state (the same on every rank)."""
    if adapt is None:
        return part
    data = json.dumps(adapt.state.to_dict()).encode()
    return dataclasses.replace(part, files={**part.files, ADAPT_FILE: data})


def adapt_state_of(parts: list[Any]) -> AdaptState | None:
    """The adaptive state a snapshot's parts hold (None: a run without one)."""
    for part in parts:
        if ADAPT_FILE in part.files:
            return AdaptState.from_dict(json.loads(part.files[ADAPT_FILE]))
    return None
