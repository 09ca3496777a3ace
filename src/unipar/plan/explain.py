"""Human-readable pieces of a plan's explanation (:meth:`unipar.plan.report.PlanReport.explain`
puts them together): a plan in one line, what one plan trades against another, the
gradient exchange and why, and why a slower plan lost."""

from __future__ import annotations

from unipar.cluster.spec import ClusterSpec
from unipar.plan.grad_sync import GradSyncDecision
from unipar.plan.representation import GradSync, Plan
from unipar.plan.strategy_search import Candidate


def trades(chosen: Candidate, other: Candidate, label: str = "the other plan") -> str:
    """What ``chosen`` trades against ``other``: the plans, each time component and
    memory part that differs by more than 1% of the step or 0.1 GiB, signed as
    chosen minus other (e.g. ``grad sync +1.20 s``: the chosen plan spends more)."""
    a, b = chosen.estimate, other.estimate
    step = max(a.step_time_s, b.step_time_s)
    time = [
        f"{name.removesuffix('_s').replace('_', ' ')} {value - vars(b.time)[name]:+.2f} s"
        for name, value in vars(a.time).items()
        if abs(value - vars(b.time)[name]) > 0.01 * step
    ]
    memory = [
        f"{name.removesuffix('_gib')} {value - vars(b.memory)[name]:+.1f} GiB"
        for name, value in vars(a.memory).items()
        if abs(value - vars(b.memory)[name]) > 0.1
    ]
    faster = 1 - a.step_time_s / b.step_time_s
    return "\n".join(
        [
            f"chosen {describe(chosen)}",
            f"versus {label} {describe(other)}",
            f"  step {a.step_time_s:.3f} s against {b.step_time_s:.3f} s "
            f"({faster:+.1%} faster); memory {a.memory.total_gib:.1f} against "
            f"{b.memory.total_gib:.1f} GiB per device",
            "  time (chosen - other): " + (", ".join(time) or "the same"),
            "  memory (chosen - other): " + (", ".join(memory) or "the same"),
        ]
    )


def corrections_text(cluster: ClusterSpec) -> list[str]:
    """The line saying how runs measured on this cluster corrected its rates (none
    where none was measured; see ``unipar calibrate --show``)."""
    corrections = cluster.corrections
    if corrections is None:
        return []
    apart = f"; {corrections.kept_apart} kept apart (overloaded)" if corrections.kept_apart else ""
    return [f"{corrections.describe()}{apart} (rates against the spec; unipar calibrate --show)"]


def exchange_text(decision: GradSyncDecision) -> str:
    """Which exchange and why: the prices of both, or why servers were not priced."""
    if decision.choice is None:
        return f"all-reduce (parameter servers not considered: {decision.why_not})"
    chosen = (
        f"parameter servers ({decision.servers}, one per node, BSP)"
        if decision.kind is GradSync.PARAMETER_SERVER
        else "all-reduce"
    )
    lost = f"; {decision.why_not}" if decision.why_not else ""
    return (
        f"{chosen}: {decision.choice.reason}; touched rows assume uniform ids (skewed ids "
        f"touch fewer){lost}"
    )


def count_text(n: float) -> str:
    """``n`` with a unit: 1.20B, 350.00M."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def versus_text(best: Candidate, other: Candidate, name: str) -> str:
    """How much slower ``other`` is than ``best``, and the part of the step that costs it."""
    slower = other.estimate.step_time_s / best.estimate.step_time_s - 1
    worst = max(
        vars(other.estimate.time).items(),
        key=lambda kv: kv[1] - vars(best.estimate.time)[kv[0]],
    )
    reason = f"more {worst[0].removesuffix('_s').replace('_', ' ')}"
    return f"  {name:60s} +{slower:.1%}  {other.estimate.step_time_s:.3f} s ({reason})"


def zero_level(candidate: Candidate | Plan) -> int:
    """The ZeRO stage of the plan (0: none; 1: optimizer state sharded; 2, 3: FSDP)."""
    plan = candidate if isinstance(candidate, Plan) else candidate.plan
    if plan.mesh.fsdp == 1:
        return 1 if plan.distributed_optimizer else 0
    return 3 if plan.reshard_after_forward else 2


def describe(candidate: Candidate | Plan) -> str:
    """One line: the mesh, sharding, micro-batches, schedule and recompute of a plan (or
    a candidate's)."""
    plan = candidate if isinstance(candidate, Plan) else candidate.plan
    mesh = plan.mesh
    parts = [f"tp={mesh.tp}", f"pp={mesh.pp}", f"dp={mesh.dp}", f"fsdp={mesh.fsdp}"]
    if mesh.cp > 1:
        parts.append(f"cp={mesh.cp}")
    if plan.sequence_parallel:
        parts.append("sp")
    if zero_level(candidate):
        parts.append(f"zero={zero_level(candidate)}")
    parts.append(f"mb={plan.microbatch_size}x{plan.num_microbatches}")
    if mesh.pp > 1:
        virtual = f"(v={plan.virtual_stages})" if plan.virtual_stages > 1 else ""
        parts.append(f"{plan.schedule.value}{virtual}")
    every = f"(every {plan.recompute_every})" if plan.recompute_every > 1 else ""
    parts.append(f"recompute={plan.recompute.value}{every}")
    return " ".join(parts)
