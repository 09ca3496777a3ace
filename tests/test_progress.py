"""The progress bar appears with the first step: nothing of it is printed while workers
start and the planner runs, and its clock (rate, ETA) starts at that first step."""

from __future__ import annotations

import io

from unipar.runtime.metrics import StepMetrics
from unipar.runtime.progress import ProgressBar


def _step(step: int) -> StepMetrics:
    return StepMetrics(step=step, loss=1.0, lr=1e-3, samples=8, tokens=64, step_time_s=0.1,
                       tokens_per_s=640.0, attempt=0, finished_at=0.0)


def test_the_bar_appears_with_the_first_step(capsys):
    stream = io.StringIO()
    bar = ProgressBar(10, enabled=True, stream=stream)
    bar.note("unipar: starting 2 workers")
    bar.start_at(4)  # resumed at step 4
    assert stream.getvalue() == ""
    assert capsys.readouterr().err == "unipar: starting 2 workers\n"
    bar.update(_step(4))
    bar.close()
    shown = stream.getvalue()
    assert "5/10" in shown and "0/10" not in shown and "loss=1.0000" in shown


def test_a_bar_never_updated_prints_nothing():
    stream = io.StringIO()
    bar = ProgressBar(10, enabled=True, stream=stream)
    bar.close()
    assert stream.getvalue() == ""
