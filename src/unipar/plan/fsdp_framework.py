"""FSDP2's own time in a step, beyond its arithmetic and collectives: how the runtime
wraps a stage into units, how often it gathers them, and the framework's time in their
hooks, buffers and optimizer step. Pure; used by :mod:`unipar.plan.cost`."""

from __future__ import annotations

from unipar.cluster.spec import DeviceSpec
from unipar.plan.representation import Plan

# Tensors per FSDP unit of the chain :mod:`unipar.runtime.calibrate_group` times FSDP's
# rates on (each layer a unit: its weight and bias); its per-parameter rate times this is
# its per-unit rate.
CALIBRATION_TENSORS_PER_UNIT = 2


def fsdp_units(plan: Plan, blocks: float) -> float:
    """FSDP units of the largest stage as the runtime wraps them: each block its own,
    plus one for the rest of each of the rank's chunks
    (:func:`unipar.runtime.parallel.data.apply_fully_shard`)."""
    return blocks + plan.virtual_stages


def fsdp_gathers(plan: Plan) -> int:
    """All-gathers of each FSDP unit per step: in forward and backward of every
    micro-batch (ZeRO-3), or once, the gathered weights kept until the step's last
    backward (ZeRO-2; the runtime's ``set_reshard_after_backward(False)`` before it)."""
    return 2 * plan.num_microbatches if plan.reshard_after_forward else 1


def fsdp_framework_time(
    plan: Plan, device: DeviceSpec, blocks: float, param_tensors: float
) -> float:
    """The framework's own time in FSDP units: per parameter and pass of each micro-batch
    whose weights are unsharded anew (hooks and bookkeeping: every micro-batch under
    ZeRO-3, the first under ZeRO-2), per unit and pass of a micro-batch whose weights
    are held (below), per unit and all-gather (unsharding it), and once per step per
    unit (gradients copied into and out of the reduce-scatter's buffers) and per sharded
    parameter (the optimizer's step on DTensors). The runtime makes each block a unit,
    plus one for the rest of each stage, uses FSDP whenever data parallelism meets
    sharding, tensor or pipeline parallelism, and syncs gradients on the last micro-batch
    only (``set_requires_gradient_sync``): what is per step is paid once, however many
    micro-batches (the rates: :mod:`unipar.runtime.calibrate_group`).

    A held micro-batch (ZeRO-2 after the first: ``set_reshard_after_backward(False)``)
    finds its unit unsharded, and FSDP2's hooks return per unit without touching its
    parameters (``FSDPParamGroup.unshard`` on a group already unsharded): it is priced
    per unit, at the calibration's own per-unit rate (its chain's units hold
    :data:`CALIBRATION_TENSORS_PER_UNIT` tensors each). Priced per parameter as the
    first, ZeRO-2 of 2-8 micro-batches of the 0.88M GPT (5 units, 69 tensors) was
    predicted 12-39% slow in two runs of ``benchmarks/plan_ranking.py``, its measured
    time growing from 1 to 8 micro-batches by what plain data parallelism's did (47-64
    ms against 48-68 ms)."""
    mesh = plan.mesh
    if mesh.data_replicas == 1 or (mesh.fsdp, mesh.tp, mesh.pp) == (1, 1, 1):
        return 0.0
    units = fsdp_units(plan, blocks)
    passes = 3 + plan.recomputed_fraction
    per_micro = param_tensors * passes * device.fsdp_unit_overhead_s
    if plan.reshard_after_forward:
        micro = plan.num_microbatches * per_micro
    else:
        held = units * CALIBRATION_TENSORS_PER_UNIT * passes * device.fsdp_unit_overhead_s
        micro = per_micro + (plan.num_microbatches - 1) * held
    per_step = units * device.fsdp_step_overhead_s
    per_step += param_tensors * device.fsdp_tensor_overhead_s
    gathers = fsdp_gathers(plan) * units * device.fsdp_gather_overhead_s
    return micro + per_step + gathers
