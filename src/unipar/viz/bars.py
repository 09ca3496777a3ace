"""The data behind ``memory.png`` and ``breakdown.png``: per plan, the cost model's memory
and time components. Pure data, no drawing."""

from __future__ import annotations

from dataclasses import dataclass

from unipar.plan.explain import describe
from unipar.plan.strategy_search import Candidate, SearchResult

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "reserved")
TIME_PARTS = ("compute", "tp_comm", "pipeline_bubble", "p2p", "grad_sync", "optimizer")


@dataclass(frozen=True)
class Bar:
    """One plan's stacked bar: ``parts`` in the order of the part names, summing to
    ``total``; ``fits``: whether the planner kept it."""

    label: str
    parts: tuple[float, ...]
    total: float
    fits: bool


def memory_bar(candidate: Candidate, label: str) -> Bar:
    """GiB per device of the rank needing the most (``MemoryBreakdown``)."""
    memory = candidate.estimate.memory
    parts = tuple(getattr(memory, f"{name}_gib") for name in MEMORY_PARTS)
    return Bar(label, parts, memory.total_gib, candidate.estimate.fits)


def time_bar(candidate: Candidate, label: str) -> Bar:
    """Seconds per step (``TimeBreakdown``)."""
    time = candidate.estimate.time
    parts = tuple(getattr(time, f"{name}_s") for name in TIME_PARTS)
    return Bar(label, parts, time.total_s, candidate.estimate.fits)


def memory_bars(result: SearchResult, top: int = 4, rejected: int = 1) -> list[Bar]:
    """The ``top`` fitting plans, fastest first, then the ``rejected`` plans closest to
    fitting (least memory first)."""
    chosen = [memory_bar(c, describe(c)) for c in result.ranked[:top]]
    return chosen + [memory_bar(c, describe(c)) for c in result.rejected[:rejected]]


def time_bars(result: SearchResult, top: int = 4) -> list[Bar]:
    return [time_bar(c, describe(c)) for c in result.ranked[:top]]
