"""What the runtime can apply today: plan options the planner knows but the runtime
does not run yet, and whether a plan fits a run (:func:`check_plan_for_run`: its
workers, its batch, the parameter servers' rules). Pure (no torch, no Ray); ``fit``
refuses a plan for which :func:`unsupported_features` says anything, and live planning
(:class:`~unipar.plan.Constraints` with ``runtime_only``) never proposes one."""

from __future__ import annotations

from enum import Enum

from unipar.errors import ConfigError
from unipar.plan.representation import GradSync, Plan, Recompute


class Feature(Enum):
    """A plan option beyond data, sharded data, tensor and pipeline parallelism."""

    CONTEXT_PARALLEL = "context parallelism (mesh.cp > 1)"
    CONTEXT_PARALLEL_COMBINED = "context parallelism with fsdp, tp or pp"
    SEQUENCE_PARALLEL = "sequence parallelism (sequence_parallel=true)"
    # the runtime shards optimizer state over plain data parallelism (dp alone)
    DATA_PARALLEL_DISTRIBUTED_OPTIMIZER = "a distributed optimizer, ZeRO-1, over dp alone"
    DISTRIBUTED_OPTIMIZER = (
        "a distributed optimizer, ZeRO-1 (distributed_optimizer=true), with fsdp, tp, pp or cp"
    )
    SELECTIVE_RECOMPUTE = "selective recompute (recompute='selective' or 'selective_op')"
    PARTIAL_RECOMPUTE = "full recompute of every n-th layer (recompute_every > 1)"


# Options the runtime does not apply yet; an option leaves this set when the runtime
# learns it (and its parity test lands).
RUNTIME_LACKS: frozenset[Feature] = frozenset(Feature) - {
    Feature.SELECTIVE_RECOMPUTE,
    Feature.PARTIAL_RECOMPUTE,
    Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER,
    Feature.SEQUENCE_PARALLEL,
    Feature.CONTEXT_PARALLEL,
}
# Options the runtime applies that live planning (fit's strategies) does not propose yet:
# context parallelism needs a model that shifts its positions (unipar's GPT and Llama).
LIVE_PLANNING_SKIPS: frozenset[Feature] = RUNTIME_LACKS | {Feature.CONTEXT_PARALLEL}

_FIXES = {
    Feature.CONTEXT_PARALLEL: "set mesh.cp to 1",
    Feature.CONTEXT_PARALLEL_COMBINED: (
        "combine cp with dp only (pp, fsdp and tp 1), or set mesh.cp to 1"
    ),
    Feature.SEQUENCE_PARALLEL: "set sequence_parallel to false",
    Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER: "set distributed_optimizer to false",
    Feature.DISTRIBUTED_OPTIMIZER: (
        "set distributed_optimizer to false (mesh.fsdp > 1 shards optimizer state with ZeRO-2/3)"
    ),
    Feature.SELECTIVE_RECOMPUTE: "use recompute 'none' or 'full'",
    Feature.PARTIAL_RECOMPUTE: "set recompute_every to 1 (every layer)",
}


def plan_features(plan: Plan) -> set[Feature]:
    """The options beyond dp, fsdp, tp and pp that ``plan`` uses."""
    used = set()
    if plan.mesh.cp > 1:
        used.add(Feature.CONTEXT_PARALLEL)
        if (plan.mesh.pp, plan.mesh.fsdp, plan.mesh.tp) != (1, 1, 1):
            used.add(Feature.CONTEXT_PARALLEL_COMBINED)
    if plan.sequence_parallel:
        used.add(Feature.SEQUENCE_PARALLEL)
    if plan.distributed_optimizer:
        only_dp = plan.mesh.world_size == plan.mesh.dp
        used.add(
            Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER
            if only_dp
            else Feature.DISTRIBUTED_OPTIMIZER
        )
    if plan.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):
        used.add(Feature.SELECTIVE_RECOMPUTE)
    if plan.recompute is Recompute.FULL and plan.recompute_every > 1:
        used.add(Feature.PARTIAL_RECOMPUTE)
    return used


def unsupported_features(plan: Plan, lacking: frozenset[Feature] = RUNTIME_LACKS) -> list[str]:
    """One message per option of ``plan`` the runtime cannot apply yet, naming the
    option and the fix (empty: the runtime runs the plan)."""
    return [
        f"the runtime cannot apply {feature.value} yet; {_FIXES[feature]}, or plan for "
        "the runtime (fit's strategy 'auto' plans only what it runs)"
        for feature in sorted(plan_features(plan) & lacking, key=lambda f: f.name)
    ]


def check_servers_plan(plan: Plan) -> None:
    """Servers serve pure data parallelism."""
    mesh = plan.mesh
    if plan.replica_samples:
        raise ConfigError(
            f"a parameter-server plan splits every global batch evenly over its workers, but "
            f"got replica_samples={list(plan.replica_samples)}; leave replica_samples out, or "
            "pass grad_sync='all_reduce'"
        )
    if mesh.world_size != mesh.dp:
        raise ConfigError(
            f"a parameter-server plan is pure data parallel, but got tp={mesh.tp} pp={mesh.pp} "
            f"fsdp={mesh.fsdp} cp={mesh.cp} dp={mesh.dp}; set the other axes to 1, or pass "
            "grad_sync='all_reduce'"
        )


def check_plan_for_run(
    plan: Plan, workers: int | tuple[int, int], global_batch_size: int | None = None
) -> None:
    """A plan the runtime can run on ``workers`` workers (one per mesh position; a range
    ``(least, most)`` for an elastic run: the plan is for a size within it), for a job of
    ``global_batch_size`` samples per step (when known)."""
    mesh = plan.mesh
    least, most = workers if isinstance(workers, tuple) else (workers, workers)
    if not least <= mesh.world_size <= most:
        size = f"{most}" if least == most else f"{least}..{most}"
        raise ConfigError(
            f"the plan's mesh needs {mesh.world_size} workers (pp={mesh.pp} x dp={mesh.dp} x "
            f"fsdp={mesh.fsdp} x cp={mesh.cp} x tp={mesh.tp}), but workers={size}; pass "
            f"workers={mesh.world_size} (--workers {mesh.world_size}) or a plan for {most} "
            "workers"
        )
    if plan.grad_sync is GradSync.PARAMETER_SERVER:
        check_servers_plan(plan)
    lacking = unsupported_features(plan)
    if lacking:
        raise ConfigError("; ".join(lacking))
    if global_batch_size is not None and plan.global_batch_size != global_batch_size:
        raise ConfigError(
            f"the plan's global batch (microbatch_size={plan.microbatch_size} x "
            f"num_microbatches={plan.num_microbatches} x data replicas="
            f"{mesh.data_replicas} = {plan.global_batch_size}) must equal the job's "
            f"global_batch_size={global_batch_size}; adjust one of them"
        )
