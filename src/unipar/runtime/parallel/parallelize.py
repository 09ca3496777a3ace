"""Apply a plan on one worker: build, split, shard, materialise (torchtitan's order).

1. Build the whole model twice from the job's factory with the job's seed: on CPU (the
   reference: exactly the single-device weights) and on the meta device (no memory).
2. On the meta model: cut out this rank's pipeline stage(s), then tensor parallel,
   activation recompute, FSDP.
3. ``to_empty`` on the device, then the reference weights sliced into each shard.
4. Pure data parallel skips all this: the reference model itself goes under DDP.

A parameter tied across pipeline stages (a word embedding on the first stage and the
output head on the last) becomes one copy per stage; their gradients are summed every
step before the optimizer (Megatron-LM's embedding all-reduce, Shoeybi et al. 2019), so
the copies stay equal. Hugging Face models train with their key/value cache off.

The result, :class:`ParallelModel`, runs one optimizer step's forward and backward
whatever the plan; batches are any tree of tensors (:mod:`unipar.data.batch`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._pytree import tree_map_only

from unipar.analysis.meta import SkipInPlaceOnMeta
from unipar.data.batch import concat
from unipar.errors import UnsupportedPlanError
from unipar.model_call import ModelCall
from unipar.models import hf
from unipar.plan import PipelineSchedule, Plan
from unipar.plan.representation import MeshCoordinates
from unipar.runtime.parallel import stages as stage_cuts
from unipar.runtime.parallel.context import (
    apply_context_parallel,
    check_context_parallel,
    sequence_chunk,
)
from unipar.runtime.parallel.data import apply_ddp, apply_fully_shard, uses_fully_shard
from unipar.runtime.parallel.distributed_optimizer import check_distributed_optimizer
from unipar.runtime.parallel.model_checks import check_plan_for_model
from unipar.runtime.parallel.recompute import apply_recompute
from unipar.runtime.parallel.tensor import (
    apply_tensor_parallel,
    placements,
    tensor_parallel_roles,
)
from unipar.runtime.parallel.weights import clean_name, load_reference_weights
from unipar.viz.records import TracedAction

Microbatch = tuple[Any, Any]  # (inputs, targets), each a tensor or a tree of them
LossFunction = Callable[[Any, Any], torch.Tensor]
# (this rank's module, inputs, targets) -> the micro-batch's loss
StepLoss = Callable[[nn.Module, Any, Any], torch.Tensor]


@dataclass
class ParallelModel:
    """This rank's share of the model and how it takes part in a step.

    ``parts`` are the modules whose parameters this rank trains: one, or several
    pipeline stages under interleaved 1F1B. ``schedule`` is the pipeline schedule
    (``None`` without a pipeline)."""

    parts: list[nn.Module]
    plan: Plan
    coordinates: MeshCoordinates
    schedule: Any = None
    pp_group: Any = None
    tied: list[TiedCopies] = field(default_factory=list)
    tracer: Any = None  # a StepTracer timing each micro-batch (no pipeline), else None
    pipeline_loss: Any = None  # the schedule's stages.PipelineLoss (last stage), else None
    device_mesh: Any = None  # the run's DeviceMesh (pp, dp, fsdp, tp) where one was made

    @property
    def data_replica(self) -> int:
        """Which slice of the global batch this rank's replica computes."""
        return self.coordinates.dp * self.plan.mesh.fsdp + self.coordinates.fsdp

    @property
    def first_stage(self) -> bool:
        return self.coordinates.pp == 0

    @property
    def last_stage(self) -> bool:
        return self.coordinates.pp == self.plan.mesh.pp - 1

    @property
    def counts_samples(self) -> bool:
        """One rank per data replica counts the replica's samples."""
        return self.first_stage and self.coordinates.tp == 0 and self.coordinates.cp == 0

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def forward_backward(
        self, microbatches: list[Microbatch], loss_of: StepLoss, observer: Any = None
    ) -> torch.Tensor | None:
        """Gradients of the mean loss over ``microbatches``; returns that loss where this
        rank computes it (``None`` on pipeline stages before the last). ``loss_of``:
        a micro-batch's loss (outside a pipeline; a pipeline's schedule holds its own).
        ``observer`` (the adaptive batch's norms): ``after_microbatch(index, count)``
        after each micro-batch's backward outside a pipeline, ``after_backward()`` once
        the step's gradients are complete (before tied copies are summed)."""
        if self.schedule is not None:
            loss = self._pipeline_step(microbatches)
            if observer is not None:
                observer.after_backward()
            for copies in self.tied:
                copies.sum_gradients()
            return loss
        total = torch.zeros(())
        for index, (inputs, targets) in enumerate(microbatches):
            if self.plan.mesh.cp > 1:  # this rank's chunk of every sequence
                inputs, targets = (
                    tree_map_only(
                        torch.Tensor,
                        lambda t: sequence_chunk(t, self.coordinates.cp, self.plan.mesh.cp),
                        tree,
                    )
                    for tree in (inputs, targets)
                )
            last = index == len(microbatches) - 1
            with _gradient_sync(
                self.parts[0], enabled=last, keep_gathered=not self.plan.reshard_after_forward
            ):
                with self._span(TracedAction.FORWARD, index):
                    loss = loss_of(self.parts[0], inputs, targets)
                    if self.plan.replica_samples:
                        loss = loss * self._uneven_weight()
                    else:
                        loss = loss / len(microbatches)
                with self._span(TracedAction.BACKWARD, index):  # the last one syncs too
                    loss.backward()
            if observer is not None:
                observer.after_microbatch(index, len(microbatches))
            total = total.to(loss.device) + loss.detach()
        if observer is not None:
            observer.after_backward()
        return total

    def _uneven_weight(self) -> float:
        """A micro-batch's weight under uneven data-parallel shares. The replicas'
        gradients are averaged (DDP), so a micro-batch weighs ``replicas * microbatch_size
        / global_batch``: the average is then the gradient of the mean loss over the whole
        global batch, as with equal shares (where the weight is ``1 / microbatches``)."""
        plan = self.plan
        return plan.mesh.data_replicas * plan.microbatch_size / plan.global_batch_size

    def _span(
        self, action: TracedAction, microbatch: int
    ) -> contextlib.AbstractContextManager[None]:
        """The tracer's span; untraced, a context that does nothing (no clock read)."""
        if self.tracer is None:
            return contextlib.nullcontext()
        return self.tracer.span(action, 0, microbatch)

    def _pipeline_step(self, microbatches: list[Microbatch]) -> torch.Tensor | None:
        """Every stage takes the step's inputs (the schedule splits them into the
        micro-batches again, leaf by leaf); the last stage's loss looks up each
        micro-batch's targets by its index, given as the schedule's target."""
        losses: list[torch.Tensor] = []
        inputs = concat([inputs for inputs, _ in microbatches])
        target = None
        if self.last_stage:
            self.pipeline_loss.targets = [targets for _, targets in microbatches]
            target = torch.arange(len(microbatches))
        self.schedule.step(target=target, losses=losses, return_outputs=False, batch=inputs)
        if not self.last_stage:
            return None
        return torch.stack([loss.detach() for loss in losses]).mean()


@dataclass
class TiedCopies:
    """This rank's copies of one parameter tied across pipeline stages, and the group
    of the other rank holding copies (``None``: all copies are here)."""

    params: list[nn.Parameter]
    group: Any = None

    @torch.no_grad()
    def sum_gradients(self) -> None:
        for param in self.params:  # e.g. an embedding's gradient comes back replicated
            grad = param.grad
            if grad is not None and placements(grad) != placements(param):
                param.grad = grad.redistribute(grad.device_mesh, param.placements)
        grads = [_local(p.grad) for p in self.params if p.grad is not None]
        if not grads:
            return
        total = grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for grad in grads:
            if grad is not total:
                grad.copy_(total)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (shares its storage); a tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _tied_copies(
    whole: nn.Module, plan: Plan, parts: list[nn.Module], indices: list[int], device_mesh: Any
) -> list[TiedCopies]:
    """For each parameter tied across stages: this rank's copies, and a process group
    with the other pipeline rank holding one. Every rank creates every group, in the
    same order (``new_group`` is collective)."""
    ranks = device_mesh.mesh.reshape(plan.mesh.pp, -1)
    me = dist.get_rank()
    result = []
    for tie in stage_cuts.cross_stage_ties(whole, plan):
        pp_ranks = sorted({stage % plan.mesh.pp for stage, _ in tie})
        group = None
        if len(pp_ranks) > 1:
            for column in range(ranks.shape[1]):
                members = [int(ranks[r, column]) for r in pp_ranks]
                created = dist.new_group(members)
                if me in members:
                    group = created
        params = []
        for stage, name in tie:
            if stage in indices:
                part = parts[indices.index(stage)]
                named = {clean_name(n): p for n, p in part.named_parameters()}
                params.append(named[name])
        if params:
            result.append(TiedCopies(params, group))
    return result


def _gradient_sync(
    module: nn.Module, *, enabled: bool, keep_gathered: bool
) -> contextlib.AbstractContextManager:
    """Skip gradient synchronisation on all but the last micro-batch; under ZeRO-2
    (``keep_gathered``) FSDP also keeps the gathered parameters until then."""
    if enabled:
        return contextlib.nullcontext()
    if hasattr(module, "no_sync"):  # DDP
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(module, keep_gathered)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(module: Any, keep_gathered: bool):  # type: ignore[no-untyped-def]
    module.set_requires_gradient_sync(False)
    if keep_gathered:
        module.set_reshard_after_backward(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
        if keep_gathered:
            module.set_reshard_after_backward(True)


def parallelize(
    build: Callable[[], nn.Module],
    plan: Plan,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    loss_fn: LossFunction,
    sample: Any,
    seed: int,
    call: ModelCall = ModelCall.POSITIONAL,
    mesh_for_step: bool = False,
) -> ParallelModel:
    """Build the model with ``build`` and apply ``plan`` for ``rank`` (see module doc).

    ``sample`` (one sample's inputs, batch of 1, taken ``call``'s way) checks that
    pipeline stages compose, values included. ``mesh_for_step``: make the run's
    :class:`~torch.distributed.device_mesh.DeviceMesh` even where the plan needs none
    (pure data parallel), for a custom step's context."""
    mesh = plan.mesh
    if mesh.world_size != world_size:
        raise UnsupportedPlanError(
            f"the plan's mesh needs {mesh.world_size} workers (pp={mesh.pp} x dp={mesh.dp} x "
            f"fsdp={mesh.fsdp} x tp={mesh.tp}), but the run has {world_size}; set workers="
            f"{mesh.world_size} or choose a plan for {world_size}"
        )
    check_distributed_optimizer(plan)
    coordinates = mesh.coordinates(rank)
    torch.manual_seed(seed)
    reference = hf.disable_cache(build())
    if mesh.cp > 1:
        check_context_parallel(reference, plan)
        cp_mesh = init_device_mesh(device.type, (mesh.dp, mesh.cp), mesh_dim_names=("dp", "cp"))
        apply_context_parallel(reference, cp_mesh["cp"], coordinates.cp)
    if (mesh.pp, mesh.fsdp, mesh.tp) == (1, 1, 1):
        model = apply_recompute(reference, plan).to(device)
        if world_size > 1:
            model = apply_ddp(model, device)
        wanted = mesh_for_step and mesh.cp == 1 and world_size > 1  # one process: no group
        made = device_mesh_for(plan, device) if wanted else None
        return ParallelModel(parts=[model], plan=plan, coordinates=coordinates, device_mesh=made)

    rng = torch.get_rng_state()
    with torch.device("meta"), SkipInPlaceOnMeta():  # no values to initialise on meta
        whole = hf.disable_cache(build())
    torch.set_rng_state(rng)  # dropout draws as in the single-device run
    check_plan_for_model(whole, plan)
    device_mesh = device_mesh_for(plan, device)
    if mesh.pp > 1:
        chunks = stage_cuts.stage_layer_names(whole, plan)
        stage_cuts.check_stages_compose(reference, chunks, sample, call)
        indices = stage_cuts.stage_indices(plan, coordinates.pp)
        parts = [stage_cuts.build_stage(whole, chunks[i]) for i in indices]
    else:
        indices, parts = [0], [whole]
    roles = tensor_parallel_roles(whole, plan) if mesh.tp > 1 else {}
    for part in parts:
        if roles:
            apply_tensor_parallel(
                part, roles, device_mesh["tp"], sequence_parallel=plan.sequence_parallel
            )
        apply_recompute(part, plan)
        if uses_fully_shard(plan):
            apply_fully_shard(part, plan, device_mesh)
        load_reference_weights(part, reference, device)
    del reference
    model = ParallelModel(
        parts=parts, plan=plan, coordinates=coordinates, device_mesh=device_mesh
    )
    if mesh.pp > 1:
        runs = [
            stage_cuts.attach_stage_forward(part, chunks, index, call)
            for part, index in zip(parts, indices, strict=True)
        ]
        last = runs[-1] if indices[-1] == len(chunks) - 1 else None
        model.pipeline_loss = stage_cuts.PipelineLoss(loss_fn, last)
        pp_group = device_mesh["pp"].get_group()
        model.pp_group = pp_group
        model.schedule = _pipeline_schedule(
            parts, indices, plan, device, pp_group, model.pipeline_loss
        )
        model.tied = _tied_copies(whole, plan, parts, indices, device_mesh)
    return model


def device_mesh_for(plan: Plan, device: torch.device) -> Any:
    """The run's DeviceMesh: axes (pp, dp, fsdp, tp) in that order."""
    mesh = plan.mesh
    return init_device_mesh(
        device.type,
        (mesh.pp, mesh.dp, mesh.fsdp, mesh.tp),
        mesh_dim_names=("pp", "dp", "fsdp", "tp"),
    )


def _pipeline_schedule(
    parts: list[nn.Module],
    indices: list[int],
    plan: Plan,
    device: torch.device,
    group: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
) -> Any:
    """``torch.distributed.pipelining`` stages for ``parts`` and the plan's schedule."""
    from torch.distributed import pipelining  # noqa: PLC0415 (heavy: torch.distributed.pipelining)

    chunks = plan.mesh.pp * plan.virtual_stages
    stages = [
        pipelining.PipelineStage(part, index, chunks, device, group=group)
        for part, index in zip(parts, indices, strict=True)
    ]
    m = plan.num_microbatches
    if plan.schedule is PipelineSchedule.INTERLEAVED_1F1B:
        return pipelining.ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    if plan.virtual_stages != 1:
        raise UnsupportedPlanError(
            f"virtual_stages={plan.virtual_stages} needs the interleaved_1f1b schedule, but the "
            f"plan has {plan.schedule.value}; set virtual_stages=1 or schedule=interleaved_1f1b"
        )
    if plan.schedule is PipelineSchedule.GPIPE:
        return pipelining.ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    return pipelining.Schedule1F1B(stages[0], m, loss_fn=loss_fn)
