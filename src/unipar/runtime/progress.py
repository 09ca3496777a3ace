"""The live progress bar and the closing summary of a run."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

from unipar.runtime.metrics import StepMetrics


class ProgressBar:
    """Step, loss, tokens/s and ETA on one line (standard error). The bar appears with
    the first step, so its clock and ETA start there, not while workers start and the
    planner runs; notes before it are plain lines."""

    def __init__(self, total_steps: int, *, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self._total, self._enabled, self._stream = total_steps, enabled, stream
        self._start = 0
        self._bar: tqdm | None = None

    def start_at(self, step: int) -> None:
        self._start = step
        if self._bar is not None:
            self._bar.n = step
            self._bar.last_print_n = step
            self._bar.refresh()

    def update(self, metrics: StepMetrics) -> None:
        if self._bar is None:
            self._bar = tqdm(
                total=self._total,
                initial=self._start,
                desc="train",
                unit="step",
                disable=not self._enabled,
                file=self._stream,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        shown = {"loss": f"{metrics.loss:.4f}", "tok_s": f"{metrics.tokens_per_s:,.0f}"}
        if (adapt := metrics.adapt) is not None:
            shown |= {
                "batch": str(adapt.global_batch),
                "noise": f"{adapt.noise_scale:.3g}",
                "eff": f"{adapt.efficiency:.2f}",
                "goodput": f"{adapt.goodput:.3g}",
            }
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(metrics.step + 1 - self._bar.n)

    def note(self, message: str) -> None:
        if self._bar is None:
            print(message, file=sys.stderr, flush=True)
        else:
            self._bar.write(message, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def format_summary(
    *,
    first_loss: float,
    last_loss: float,
    steps: int,
    tokens_per_s: float,
    wall_time_s: float,
    failures: int,
    checkpoint: str,
    metrics_path: str,
    resizes: list[str] | None = None,
    trace: str | None = None,
    predictions: list[str] | None = None,
) -> str:
    """The closing summary; ``predictions``: each formation's predicted against
    measured step time (:func:`unipar.runtime.learn.summary_lines`)."""
    lines = [
        "unipar run summary",
        f"  loss          {first_loss:.4f} -> {last_loss:.4f} over {steps} steps",
        f"  throughput    {tokens_per_s:,.0f} tokens/s",
        *(predictions or []),
        f"  wall time     {wall_time_s:.1f} s (restarts after failures: {failures})",
        *([f"  resizes       {'; '.join(resizes)}"] if resizes else []),
        f"  checkpoint    {checkpoint}",
        f"  metrics       {metrics_path}",
    ]
    if trace:
        lines.append(trace)
    return "\n".join(lines)
