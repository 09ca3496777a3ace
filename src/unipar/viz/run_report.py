"""``unipar report RUN_DIR``: loss, tokens/s, step time (measured, and the plan's
prediction) and learning rate over samples consumed, from the run's ``metrics.jsonl``,
with restarts and resizes marked; for an adaptive batch also the global batch, noise
scale, statistical efficiency and predicted goodput."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unipar.errors import ConfigError
from unipar.viz.draw import pyplot

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Marker:
    samples: int  # samples consumed when it happened
    label: str


@dataclass(frozen=True)
class RunSeries:
    """One point per step (the last record of a step a restart repeated)."""

    steps: tuple[int, ...]
    samples: tuple[int, ...]  # consumed by the end of each step
    loss: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    lr: tuple[float, ...]
    restarts: tuple[Marker, ...]
    events: tuple[Marker, ...]  # resizes and other events the run recorded
    # an adaptive batch's curves by name (global_batch, noise_scale, ...); empty otherwise
    adapt: dict[str, tuple[float, ...]] = field(default_factory=dict)
    step_time_s: tuple[float, ...] = ()
    # the cost model's step time of the plan each step ran under (nan: not predicted)
    predicted_step_s: tuple[float, ...] = ()


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    hint = "give the --run-dir of a `unipar train` run (or fit(run_dir=...)) that ran a step"
    if not run_dir.is_dir():
        raise ConfigError(
            f"the run directory {run_dir} does not exist or is not a directory; {hint}"
        )
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {METRICS_FILE}: no metrics to report; {hint}")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{path} line {number} is not JSON ({error.msg}); the file must hold one JSON "
                "object per line, as the runtime writes it"
            ) from error
    if not any("step" in r and "loss" in r for r in records):
        raise ConfigError(f"{path} holds no step metrics (no record with step and loss); {hint}")
    return records


def _is_event(record: dict[str, Any]) -> bool:
    return "resize" in record or "event" in record


def run_series(run_dir: str | Path) -> RunSeries:
    """The run's curves and markers: a restart is a step whose ``attempt`` is higher than
    the previous record's; an event is a record with a ``resize`` or ``event`` key."""
    records = _records(Path(run_dir))
    steps = [r for r in records if not _is_event(r) and "step" in r]
    last: dict[int, dict[str, Any]] = {}
    for record in steps:
        last[record["step"]] = record
    ordered = [last[s] for s in sorted(last)]
    consumed, total = {}, 0
    for record in ordered:
        consumed[record["step"]] = (total, total + record["samples"])
        total += record["samples"]

    def before(record: dict[str, Any]) -> int:
        """Samples consumed when the record's step began (or at the record's samples)."""
        if "samples_consumed" in record:
            return int(record["samples_consumed"])
        step = record.get("step")
        if step in consumed:
            return consumed[step][0]
        return total if step is None or step > max(consumed) else 0

    restarts, attempt = [], None
    for record in steps:
        now = record.get("attempt", 0)
        if attempt is not None and now > attempt:
            restarts.append(Marker(before(record), f"restart (attempt {now})"))
        attempt = now
    events = [Marker(before(r), _event_label(r)) for r in records if _is_event(r)]
    return RunSeries(
        steps=tuple(r["step"] for r in ordered),
        samples=tuple(consumed[r["step"]][1] for r in ordered),
        loss=tuple(float(r["loss"]) for r in ordered),
        tokens_per_s=tuple(float(r.get("tokens_per_s", 0.0)) for r in ordered),
        lr=tuple(float(r.get("lr", 0.0)) for r in ordered),
        restarts=tuple(restarts),
        events=tuple(events),
        adapt=_adapt_curves(ordered),
        step_time_s=tuple(float(r.get("step_time_s", math.nan)) for r in ordered),
        predicted_step_s=tuple(_number(r.get("predicted_step_s")) for r in ordered),
    )


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


STEP_TIME = "step time (s)"
NO_SIGNAL = 1e12  # a noise scale past this is tr(Σ) over the estimator's floor on |G|²
ADAPT_LABELS = {
    "global_batch": "global batch",
    "noise_scale": "noise scale B_simple",
    "efficiency": "statistical efficiency",
    "goodput": "predicted goodput (M0-steps/s)",
}


def _adapt_curves(records: list[dict[str, Any]]) -> dict[str, tuple[float, ...]]:
    """The adaptive batch's figures of each step (records a job with ``adaptive`` wrote)."""
    if not records or not all(isinstance(r.get("adapt"), dict) for r in records):
        return {}
    return {name: tuple(float(r["adapt"][name]) for r in records) for name in ADAPT_LABELS}


def _event_label(record: dict[str, Any]) -> str:
    """``resize 2 -> 4 (reason)`` for the runtime's resize records (``{"event": "resize",
    "old": 2, "new": 4, "reason": ...}``), else the event's name."""
    name = str(record.get("event", "resize"))
    if {"old", "new"} <= set(record):
        reason = f" ({record['reason']})" if record.get("reason") else ""
        return f"{name} {record['old']} -> {record['new']}{reason}"
    return name


def report_run(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report.png``; returns its path."""
    run_dir = Path(run_dir)
    series = run_series(run_dir)
    plt = pyplot()
    curves = [
        ("loss", series.loss),
        ("tokens/s", series.tokens_per_s),
        (STEP_TIME, series.step_time_s),
        ("learning rate", series.lr),
        *((ADAPT_LABELS[name], values) for name, values in series.adapt.items()),
    ]
    figure, axes = plt.subplots(len(curves), 1, figsize=(10, 2.7 * len(curves)), sharex=True)
    for axis, (name, values) in zip(axes, curves, strict=True):
        if name == ADAPT_LABELS["noise_scale"]:  # no estimate yet, or |G|² not above 0
            values = tuple(v if 0 < v < NO_SIGNAL else math.nan for v in values)
            axis.set_yscale("log")
        axis.plot(series.samples, values, marker="." if len(values) < 60 else None, linewidth=1)
        if name == STEP_TIME and any(not math.isnan(v) for v in series.predicted_step_s):
            axis.plot(series.samples, series.predicted_step_s, color="#DD8452",
                      linestyle="--", linewidth=1.5, label="predicted (the plan's)")
            axis.legend(fontsize=7, loc="upper right")
        axis.set_ylabel(name, fontsize=8)
        axis.grid(alpha=0.3)
        for marker in series.restarts:
            axis.axvline(marker.samples, color="#C44E52", linestyle="--", linewidth=1)
        for marker in series.events:
            axis.axvline(marker.samples, color="#55A868", linestyle=":", linewidth=1.5)
    for marker in (*series.restarts, *series.events):
        axes[0].annotate(
            marker.label,
            (marker.samples, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
        )
    axes[-1].set_xlabel("samples consumed")
    axes[0].set_title(
        f"{run_dir.name}: {len(series.steps)} steps, {series.samples[-1]} samples, "
        f"{len(series.restarts)} restart(s), {len(series.events)} event(s)",
        fontsize=10,
    )
    figure.tight_layout()
    path = run_dir / "report.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
