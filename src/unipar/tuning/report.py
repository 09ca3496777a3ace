"""What a tuning run shows: a line per running trial and an overall bar while it runs;
then a sorted table (also written as ``results.txt``/``results.json``) and a PNG of every
trial's loss curve (stopped ones marked)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback

from unipar.errors import TuningFailedError
from unipar.viz.draw import pyplot


@dataclass(frozen=True)
class TrialRow:
    trial_id: str
    config: dict[str, Any]
    value: float
    steps: int
    status: str  # "done" (ran to the end), "stopped" (by the scheduler/pruner), "error"


def best_first(rows: Sequence[TrialRow], mode: str) -> list[TrialRow]:
    """The rows best first (``mode``: "min" or "max"), trials without a value last."""
    sign = 1.0 if mode == "min" else -1.0
    return sorted(
        rows, key=lambda r: (r.value != r.value, sign * r.value if r.value == r.value else 0.0)
    )


def format_table(rows: Sequence[TrialRow], metric: str) -> str:
    """Rows as a text table, best first (``rows`` already sorted)."""
    keys = sorted({k for r in rows for k in r.config})
    head = ["trial", *keys, metric, "at step", "status"]
    body = [
        [
            r.trial_id,
            *(_short(r.config.get(k)) for k in keys),
            f"{r.value:.4f}",
            str(r.steps),
            r.status,
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=False)]
    lines = [
        "  ".join(x.ljust(w) for x, w in zip(line, widths, strict=False)) for line in [head, *body]
    ]
    return "\n".join(lines)


def write_results(rows: Sequence[TrialRow], metric: str, folder: Path) -> Path:
    """The sorted table as ``results.txt`` and the rows as ``results.json`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.txt").write_text(format_table(rows, metric) + "\n")
    path = folder / "results.json"
    path.write_text(json.dumps([asdict(r) for r in rows], indent=1, default=str) + "\n")
    return path


def require_a_value(rows: Sequence[TrialRow], metric: str, folder: Path) -> None:
    """Refuse an experiment where no trial ended with a number for ``metric``."""
    if any(r.value == r.value for r in rows):  # NaN != NaN
        return
    failed = sum(r.status == "error" for r in rows)
    raise TuningFailedError(
        f"no trial ended with a value of {metric!r}: {len(rows) - failed} of {len(rows)} "
        f"ended with NaN, {failed} failed; a NaN loss means training diverged: lower the "
        f"learning rate (the top of its range) or add warm-up steps. The trials are in "
        f"{folder / 'results.txt'}"
    )


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def draw_curves(
    curves: dict[str, tuple[list[int], list[float], str]], metric: str, path: Path
) -> Path:
    """One loss curve per trial; an x marks where a stopped trial ended."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    for trial_id, (steps, values, status) in sorted(curves.items()):
        (line,) = axis.plot(steps, values, label=trial_id, linewidth=1)
        if status == "stopped" and steps:
            axis.plot(steps[-1], values[-1], "x", color=line.get_color(), markersize=8)
    axis.set_xlabel("step")
    axis.set_ylabel(metric)
    axis.set_title(f"{len(curves)} trials ({metric}); x: stopped early")
    if len(curves) <= 16:
        axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


class LiveProgress(Callback):
    """Prints, at most every ``every_s`` seconds, one line per running trial and a bar."""

    def __init__(self, total: int, metric: str, *, every_s: float = 2.0, enabled: bool = True):
        self.total, self.metric, self.every_s, self.enabled = total, metric, every_s, enabled
        self.latest: dict[str, dict[str, Any]] = {}
        self.done: set[str] = set()
        self._last = 0.0

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.latest[trial.trial_id] = result
        self._show(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.done.add(trial.trial_id)
        self._show(trials, force=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.done.add(trial.trial_id)
        self._show(trials, force=True)

    def _show(self, trials: list, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return
        self._last = now
        lines = []
        for trial in trials:
            if trial.status != "RUNNING":
                continue
            result = self.latest.get(trial.trial_id, {})
            value = result.get(self.metric)
            shown = f"{value:.4f}" if isinstance(value, float) else "-"
            lines.append(
                f"  {trial.trial_id}  step {result.get('step', 0):>5}  {self.metric} {shown}"
            )
        done = len(self.done)
        filled = int(30 * done / max(1, self.total))
        lines.append(f"  [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} trials done")
        print("\n".join(lines), file=sys.stderr, flush=True)
