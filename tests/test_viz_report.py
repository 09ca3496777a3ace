"""``unipar report``: the curves and markers behind report.png, the PNG, bad input."""

from __future__ import annotations

import json

import pytest
from png_checks import check_png

from unipar.cli.main import main
from unipar.errors import ConfigError
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.viz.run_report import report_run, run_series


def _write_run(run_dir):
    """Steps 0-5 on attempt 0, a crash after step 5, steps 4-9 again on attempt 1 (the
    resumed run repeats 4 and 5), then a resize event and steps 10-11."""
    writer = MetricsWriter(run_dir / "metrics.jsonl")

    def step(number, attempt, samples=8):
        metrics = StepMetrics(
            step=number,
            loss=5.0 - 0.1 * number + 0.01 * attempt,
            lr=1e-3 * (number + 1),
            samples=samples,
            tokens=samples * 16,
            step_time_s=0.1,
            tokens_per_s=1280.0 + attempt,
            attempt=attempt,
            finished_at=float(number),
            predicted_step_s=0.08 if number < 10 else 0.05,  # the plan's, each size's
        )
        writer.write(metrics)

    for number in range(6):
        step(number, 0)
    for number in range(4, 10):
        step(number, 1)
    writer.close()
    with open(run_dir / "metrics.jsonl", "a") as file:
        resize = {"event": "resize", "step": 10, "old": 2, "new": 4, "reason": "node added"}
        file.write(json.dumps(resize))
        file.write("\n")
    writer = MetricsWriter(run_dir / "metrics.jsonl")
    for number in (10, 11):
        step(number, 1, samples=16)
    writer.close()


def test_series_count_samples_once_and_mark_restarts_and_resizes(tmp_path):
    _write_run(tmp_path)
    series = run_series(tmp_path)
    assert series.steps == tuple(range(12))
    assert series.samples == (*[8 * (k + 1) for k in range(10)], 96, 112)
    assert series.loss[5] == pytest.approx(5.0 - 0.5 + 0.01)  # the repeated step's last record
    assert [(m.samples, m.label) for m in series.restarts] == [(32, "restart (attempt 1)")]
    assert [(m.samples, m.label) for m in series.events] == [(80, "resize 2 -> 4 (node added)")]
    assert series.step_time_s == (0.1,) * 12  # measured against predicted, drawn together
    assert series.predicted_step_s == (0.08,) * 10 + (0.05,) * 2


def test_report_writes_a_picture(tmp_path, capsys):
    _write_run(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    assert str(tmp_path / "report.png") in capsys.readouterr().out
    check_png(tmp_path / "report.png")


@pytest.mark.parametrize("content", [None, "", '{"event": "resize", "resize": 2}\n'])
def test_report_without_metrics_is_refused(tmp_path, content):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ConfigError, match="metrics"):
        report_run(tmp_path)
    assert not (tmp_path / "report.png").exists()


def test_cli_report_on_a_missing_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
