"""A given plan, re-derived for another number of workers (pure: no Ray, no torch).

The global batch never changes. The data axis grows or shrinks: ``fsdp`` when the
plan shards (ZeRO), else ``dp``. The micro-batch size is kept when it still divides
each replica's share (then a resized run computes the very same micro-batches and
only the gradient sum is grouped differently), else the number of micro-batches.
When the size is not a multiple of ``pp * tp``, the pipeline is cut into fewer
stages (every ``pp / pp'``-th stage boundary kept) and then tensor parallelism is
dropped, the largest model axes that fit first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan
from unipar.plan.representation import Mesh


def _batch_split(plan: Plan, replicas: int, global_batch: int) -> tuple[int, int] | None:
    """(microbatch_size, num_microbatches) for ``replicas`` data replicas, or None."""
    if global_batch % replicas:
        return None
    share = global_batch // replicas
    if share % plan.microbatch_size == 0:
        return plan.microbatch_size, share // plan.microbatch_size
    if share % plan.num_microbatches == 0:
        return share // plan.num_microbatches, plan.num_microbatches
    return share, 1


def _fewer_stages(plan: Plan, pp: int) -> dict[str, Any]:
    """The plan's changes for ``pp`` stages: every ``pp``-th of its stage boundaries."""
    if pp == plan.mesh.pp:
        return {}
    step = plan.mesh.pp // pp
    boundaries = plan.stage_boundaries[step - 1 :: step][: pp - 1] if pp > 1 else ()
    return {"stage_boundaries": tuple(boundaries), "virtual_stages": 1}


def resize_plan(plan: Plan, workers: int) -> Plan | None:
    """``plan`` for ``workers`` workers and the same global batch, or None if none of
    the reductions above gives one."""
    if plan.replica_samples:  # uneven shares are for the replicas they were made for
        return plan if workers == plan.mesh.world_size else None
    mesh, batch = plan.mesh, plan.global_batch_size
    for pp in [d for d in range(mesh.pp, 0, -1) if mesh.pp % d == 0]:
        for tp in (mesh.tp, 1) if mesh.tp > 1 else (1,):
            model_axes = pp * tp
            if workers % model_axes:
                continue
            data = workers // model_axes
            sharded = mesh.fsdp > 1
            if sharded and mesh.dp > 1 and data % mesh.dp == 0:
                dp, fsdp = mesh.dp, data // mesh.dp
            elif sharded:
                dp, fsdp = 1, data
            else:
                dp, fsdp = data, 1
            split = _batch_split(plan, dp * fsdp, batch)
            if split is None:
                continue
            if pp > 1 and split[1] < pp:
                continue  # 1F1B needs a micro-batch per stage
            changes = _fewer_stages(plan, pp)
            if tp != mesh.tp:
                changes.update(layer_tp=(), sequence_parallel=False)
            return replace(
                plan,
                **changes,
                mesh=Mesh(pp=pp, dp=dp, fsdp=fsdp, tp=tp),
                microbatch_size=split[0],
                num_microbatches=split[1],
            )
    return None


def sizes_that_work(plan: Plan, low: int, high: int) -> list[int]:
    return [n for n in range(low, high + 1) if resize_plan(plan, n) is not None]


def usable_size(plan: Plan, low: int, high: int) -> int | None:
    """The largest size in ``low..high`` that takes ``plan``."""
    works = sizes_that_work(plan, low, high)
    return works[-1] if works else None


def require_resizable(plan: Plan, low: int, high: int) -> None:
    """Refuse a worker range whose smallest size cannot take ``plan`` (the run must be
    able to shrink to it); name the sizes that can."""
    if resize_plan(plan, low) is None:
        works = sizes_that_work(plan, 1, max(high, 2 * plan.mesh.world_size))
        raise UnsupportedPlanError(
            f"the plan (pp={plan.mesh.pp}, dp={plan.mesh.dp}, fsdp={plan.mesh.fsdp}, "
            f"tp={plan.mesh.tp}, global batch {plan.global_batch_size}) cannot be resharded "
            f"to {low} workers, the least of the range {low}..{high}; sizes that work: "
            f"{', '.join(map(str, works)) or 'none'}; choose a range among them or another "
            "global batch"
        )
