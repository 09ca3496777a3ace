"""Human-readable explanation of a plan: the choice, its numbers, and why others lost."""

from __future__ import annotations

from typing import TYPE_CHECKING

from unipar.cluster.spec import ClusterSpec
from unipar.plan.grad_sync import GradSyncDecision
from unipar.plan.strategy_search import Candidate
from unipar.ps.cost import SyncKind

if TYPE_CHECKING:
    from unipar.plan.report import PlanReport


def explain(report: PlanReport) -> str:
    from unipar.plan.report import describe

    best = report.best
    p = report.predicted()
    e = best.estimate
    cluster = report.cluster
    lines = [
        f"model: {_count(report.profile.params)} parameters, {len(report.profile.layers)} "
        f"layers; cluster: {cluster.nodes} x {cluster.devices_per_node} {cluster.device.name} "
        f"({cluster.device.memory_gib:.1f} GiB); global batch {report.global_batch_size}",
        *_corrections(cluster),
        f"searched {report.result.evaluated} plans in {report.result.search_time_s:.2f} s "
        f"(analysis {report.analysis_time_s:.2f} s)",
        "",
        f"chosen: {describe(best)}",
        f"  step time      {p['step_time_s']:.3f} s   ({p['tokens_per_s']:,.0f} tokens/s)",
        f"  per device     {p['tflops_per_device']:.1f} TFLOP/s executed, MFU {p['mfu']:.1%}",
        "  time           "
        + ", ".join(
            f"{name.removesuffix('_s').replace('_', ' ')} {value:.3f}"
            for name, value in vars(e.time).items()
            if value > 0
        ),
        f"  memory/device  {e.memory.total_gib:.1f} GiB of {cluster.device.memory_gib:.1f}: "
        + ", ".join(
            f"{name.removesuffix('_gib')} {value:.1f}" for name, value in vars(e.memory).items()
        ),
    ]
    if best.plan.stage_boundaries:
        lines.append(f"  stages start at layers {list(best.plan.stage_boundaries)}")
    if report.grad_sync is not None:
        lines.append(f"  gradients      {_exchange(report.grad_sync)}")
    alternatives = report.result.ranked[1:6]
    if alternatives:
        lines += ["", "next best (slower by):"]
        lines += [_versus(best, c, describe(c)) for c in alternatives]
    rejected = report.result.rejected[:3]
    if rejected:
        lines += ["", "rejected, over memory (by):"]
        lines += [
            f"  {describe(c):60s} needs {c.estimate.memory.total_gib:.1f} GiB "
            f"(+{c.estimate.memory.total_gib - cluster.device.memory_gib:.1f})"
            for c in rejected
        ]
    return "\n".join(lines)


def trades(chosen: Candidate, other: Candidate, label: str = "the other plan") -> str:
    """What ``chosen`` trades against ``other``: the plans, each time component and
    memory part that differs by more than 1% of the step or 0.1 GiB, signed as
    chosen minus other (e.g. ``grad sync +1.20 s``: the chosen plan spends more)."""
    from unipar.plan.report import describe

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


def _corrections(cluster: ClusterSpec) -> list[str]:
    """The line saying how runs measured on this cluster corrected its rates (none
    where none was measured; see ``unipar calibrate --show``)."""
    corrections = cluster.corrections
    if corrections is None:
        return []
    apart = f"; {corrections.kept_apart} kept apart (overloaded)" if corrections.kept_apart else ""
    return [f"{corrections.describe()}{apart} (rates against the spec; unipar calibrate --show)"]


def _exchange(decision: GradSyncDecision) -> str:
    """Which exchange and why: the prices of both, or why servers were not priced."""
    if decision.choice is None:
        return f"all-reduce (parameter servers not considered: {decision.why_not})"
    chosen = (
        f"parameter servers ({decision.servers}, one per node, BSP)"
        if decision.kind is SyncKind.PARAMETER_SERVER
        else "all-reduce"
    )
    lost = f"; {decision.why_not}" if decision.why_not else ""
    return (
        f"{chosen}: {decision.choice.reason}; touched rows assume uniform ids (skewed ids "
        f"touch fewer){lost}"
    )


def _count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def _versus(best: Candidate, other: Candidate, name: str) -> str:
    slower = other.estimate.step_time_s / best.estimate.step_time_s - 1
    worst = max(
        vars(other.estimate.time).items(),
        key=lambda kv: kv[1] - vars(best.estimate.time)[kv[0]],
    )
    reason = f"more {worst[0].removesuffix('_s').replace('_', ' ')}"
    return f"  {name:60s} +{slower:.1%}  {other.estimate.step_time_s:.3f} s ({reason})"
