"""What every benchmark here shares: sides alternated over repeats, medians with their
spread, ratios that a missing or infinite time cannot pass, correctness checks, and the one
``RESULT key=value ...`` line.

Rules (docs/benchmarks-method.md):

- each side runs once per repeat, the order rotated each repeat (A B C, B C A, C A B), so
  no side always runs first on a machine whose speed drifts;
- a figure is the median over repeats, printed with its range (min-max); a ratio is the
  median of the per-repeat ratios (each pairs two runs made minutes apart), and its range;
- a time that is missing (the run failed) or undefined makes every ratio built on it NaN,
  and NaN meets no target; an infinite time (a target never reached) gives an infinite
  ratio on our side and NaN on the peer's (no comparison can be made with a peer that
  never got there);
- correctness checks (losses, predictions, every job done) and targets are printed as
  they are decided; the process exits 1 when a check failed or, except under ``--quick``
  (a smoke run at reduced scale, not a measurement), a target was missed.

Pure: imports nothing beyond the standard library, so the arithmetic is tested without
running a benchmark (tests/test_benchmark_arithmetic.py).
"""

from __future__ import annotations

import argparse
import math
import statistics
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

MISSING = math.nan


def number(value: float | None) -> float:
    """``value`` as a float; ``None`` (a run that gave nothing) is NaN."""
    return MISSING if value is None else float(value)


@dataclass(frozen=True)
class Spread:
    """The median of a figure over repeats, and its range. A repeat that gave nothing
    (``None`` or NaN) makes the whole figure missing: a failure is not averaged away."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        numbers = [number(v) for v in values]
        if not numbers or any(math.isnan(v) for v in numbers):
            return cls(MISSING, MISSING, MISSING, len(numbers))
        return cls(statistics.median(numbers), min(numbers), max(numbers), len(numbers))

    @property
    def missing(self) -> bool:
        return math.isnan(self.median)

    def __str__(self) -> str:
        if self.count <= 1:
            return fmt(self.median)
        return f"{fmt(self.median)} ({fmt(self.low)}-{fmt(self.high)}, n={self.count})"


def fmt(value: float | int | None, digits: int = 3) -> str:
    """``value`` for a RESULT line: ints as they are, floats with ``digits`` decimals,
    ``inf``, ``nan``."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    value = number(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def ratio(ours: float | None, peer: float | None) -> float:
    """``ours / peer`` for two times (or rates) that must be positive.

    Missing, NaN, zero or negative on either side: NaN. Ours infinite (never reached)
    and the peer's finite: ``inf``. The peer's infinite: NaN (nothing to compare with).
    """
    a, b = number(ours), number(peer)
    if math.isnan(a) or math.isnan(b) or a < 0 or b <= 0 or math.isinf(b):
        return MISSING
    return a / b  # inf / finite = inf


def paired_ratios(ours: Sequence[float | None], peer: Sequence[float | None]) -> list[float]:
    """The ratio of each repeat's pair (repeat i of ours over repeat i of the peer)."""
    if len(ours) != len(peer):
        raise ValueError(f"paired ratios need as many repeats on each side: {len(ours)} vs "
                         f"{len(peer)}")
    return [ratio(a, b) for a, b in zip(ours, peer, strict=True)]


def ratio_spread(ours: Sequence[float | None], peer: Sequence[float | None]) -> Spread:
    """The median and range of the per-repeat ratios ``ours / peer``."""
    return Spread.of(paired_ratios(ours, peer))


def overhead(with_cost: float | None, without: float | None) -> float:
    """``1 - with/without`` for two rates (steps/s): the share of speed lost. Below 0
    the run with the cost was faster, i.e. the difference is noise; NaN where a rate is
    missing or not positive."""
    return 1.0 - ratio(with_cost, without)


def meets(value: float | Spread, limit: float, *, at_most: bool = True) -> bool:
    """Whether ``value`` (a Spread's median) is within ``limit``; NaN never is."""
    v = value.median if isinstance(value, Spread) else number(value)
    if math.isnan(v):
        return False
    return v <= limit if at_most else v >= limit


def max_relative_difference(
    ours: Sequence[float], reference: Sequence[float], *, atol: float = 0.0
) -> float:
    """``max |a - b| / max(|b|, atol)`` over two equally long series; ``inf`` when their
    lengths differ or either holds a NaN (a series that is not there is not equal)."""
    if len(ours) != len(reference) or not reference:
        return math.inf
    worst = 0.0
    for a, b in zip(ours, reference, strict=True):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.inf
        worst = max(worst, abs(a - b) / max(abs(b), atol, 1e-300))
    return worst


def rounding_floor(reference: Sequence[float], twin: Sequence[float], *,
                   atol: float = 0.0) -> list[float]:
    """Per step, the running maximum of ``|reference - twin| / max(|reference|, atol)``:
    how far one training drifts from itself when only the order of its float sums changes
    (``twin`` is the reference recomputed with another thread count). Rounding differences
    grow with the steps (for the multi_job MLPs about tenfold per 100 steps late in
    training), so a fixed tolerance over a long run tests the reference's own noise."""
    if len(reference) != len(twin):
        raise ValueError(f"the reference has {len(reference)} steps, its twin {len(twin)}")
    floor, worst = [], 0.0
    for b, c in zip(reference, twin, strict=True):
        worst = max(worst, abs(float(b) - float(c)) / max(abs(float(b)), atol, 1e-300))
        floor.append(worst)
    return floor


def worst_over_envelope(ours: Sequence[float], reference: Sequence[float],
                        floor: Sequence[float], *, rtol: float, factor: float,
                        atol: float = 0.0) -> float:
    """``max`` over steps of the relative difference of ``ours`` from ``reference`` divided
    by that step's allowance ``max(rtol, factor * floor[step])``: at most 1 when every step
    is within the allowance. ``inf`` when the lengths differ or a NaN appears."""
    if len(ours) != len(reference) or len(floor) != len(reference) or not reference:
        return math.inf
    worst = 0.0
    for a, b, noise in zip(ours, reference, floor, strict=True):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.inf
        diff = abs(a - b) / max(abs(b), atol, 1e-300)
        worst = max(worst, diff / max(rtol, factor * noise))
    return worst


def alternate(
    sides: Mapping[str, Callable[[], T]], repeats: int, *, log: Callable[[str], None] = print
) -> dict[str, list[T | None]]:
    """Run each side once per repeat, the order rotated by one each repeat; a side that
    raises is recorded as ``None`` for that repeat (its error printed) and the others go
    on. Returns each side's results in repeat order."""
    names = list(sides)
    results: dict[str, list[T | None]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            log(f"[repeat {repeat + 1}/{repeats}] {name} ...")
            try:
                results[name].append(sides[name]())
            except Exception:  # a failed side is a missing figure, not a crash of the others
                log(f"[repeat {repeat + 1}/{repeats}] {name} FAILED:\n"
                    f"{traceback.format_exc()[-3000:]}")
                results[name].append(None)
    return results


def order_of(names: Sequence[str], repeat: int) -> list[str]:
    """The order :func:`alternate` runs ``names`` in at ``repeat`` (for benchmarks that
    loop themselves)."""
    shift = repeat % len(names)
    return list(names[shift:]) + list(names[:shift])


@dataclass
class Verdict:
    """The checks and targets of one invocation, printed as they are decided, and the
    RESULT line; :meth:`finish` returns the exit status."""

    quick: bool = False
    failed_checks: list[str] = field(default_factory=list)
    missed_targets: list[str] = field(default_factory=list)
    log: Callable[[str], None] = print

    def check(self, ok: bool, what: str) -> bool:
        """A correctness check (results right, every job done, ...)."""
        self.log(f"check {'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            self.failed_checks.append(what)
        return ok

    def target(self, name: str, value: float | Spread, limit: float, *,
               at_most: bool = True) -> bool:
        """A target the issues set (``name <= limit``, or ``>=`` with ``at_most=False``)."""
        ok = meets(value, limit, at_most=at_most)
        shown = value if isinstance(value, Spread) else fmt(value)
        sign = "<=" if at_most else ">="
        note = "" if ok or not self.quick else " (quick run: not a measurement)"
        self.log(f"target {name} {sign} {limit:g}: {shown}: {'ok' if ok else 'MISSED'}{note}")
        if not ok:
            self.missed_targets.append(name)
        return ok

    def finish(self, values: Mapping[str, float | int | Spread | str]) -> int:
        """Print the RESULT line; 1 if a check failed or (not quick) a target was missed."""
        self.log(result_line(values))
        if self.failed_checks:
            return 1
        return 1 if self.missed_targets and not self.quick else 0


def result_line(values: Mapping[str, float | int | Spread | str]) -> str:
    """``RESULT key=value ...``: a Spread gives ``key=median key_min=low key_max=high``."""
    parts = []
    for key, value in values.items():
        if isinstance(value, Spread):
            parts += [f"{key}={fmt(value.median)}", f"{key}_min={fmt(value.low)}",
                      f"{key}_max={fmt(value.high)}"]
        elif isinstance(value, str):
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={fmt(value)}")
    return "RESULT " + " ".join(parts)


def add_common_arguments(parser: argparse.ArgumentParser, *, repeats: int = 3) -> None:
    """``--repeats`` (default ``repeats``, at least 3 for a measurement) and ``--quick``."""
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"alternated repeats of every side (default {repeats}; "
                        "--quick: fewer)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run at reduced scale: checks and the RESULT line, "
                        "not a measurement (targets do not decide the exit status)")


def repeats_of(args: argparse.Namespace, *, full: int = 3, quick: int = 2) -> int:
    """The repeats asked for, else ``quick`` under --quick, else ``full``."""
    if args.repeats is not None:
        if args.repeats < 1:
            raise SystemExit(f"--repeats must be at least 1, but got {args.repeats}")
        return args.repeats
    return quick if args.quick else full
