"""The cost model against published modern runs (``tests/reference/modern_runs.csv``:
Llama 3's 405B runs on 8,192 and 16,384 H100 and torchtitan's FSDP runs on H100 and
A100, each row with its source). Each row is planned with its published plan pinned;
the predicted step time should be within 15% of the published one, and the median
within 7%. Rows the model misses today are marked (strict: a fix shows up as an
unexpected pass), with the measured error and what the model lacks. Free search is
never predicted slower than the published plan."""

from __future__ import annotations

import statistics

import pytest
from modern_runs import ROWS, outcome, plan_row

ROW_BOUND, MEDIAN_BOUND = 0.15, 0.07

# id: (error measured when this table was built, why)
KNOWN_MISSES = {
    "llama3_405b_128k_gpu16384": (
        -0.169,
        "Llama 3's context parallelism all-gathers keys and values before attention, "
        "latency exposed (Dubey et al. 2024, Sec. 3.3.2); the model's cp is a ring "
        "hidden behind the attention compute",
    ),
}


@pytest.fixture(scope="module")
def outcomes():
    return {row["id"]: outcome(row) for row in ROWS}


def _marks(row):
    if row["id"] not in KNOWN_MISSES:
        return ()
    error, why = KNOWN_MISSES[row["id"]]
    return pytest.mark.xfail(strict=True, reason=f"{error:+.1%}: {why}")


@pytest.mark.parametrize("row", [pytest.param(r, id=r["id"], marks=_marks(r)) for r in ROWS])
def test_published_plan_predicted_within_15_percent(row, outcomes):
    result = outcomes[row["id"]]
    assert result.pinned.best.estimate.fits
    assert abs(result.error) <= ROW_BOUND, (result.predicted_step_s, result.measured_step_s)


def test_known_misses_are_measured_as_recorded(outcomes):
    """The recorded errors stay what they are (within 3 points): a change to the cost
    model that moves them shows here."""
    for row_id, (error, _) in KNOWN_MISSES.items():
        assert outcomes[row_id].error == pytest.approx(error, abs=0.03), row_id


def test_median_error_within_7_percent(outcomes):
    assert statistics.median(abs(o.error) for o in outcomes.values()) <= MEDIAN_BOUND


@pytest.mark.parametrize("row", [pytest.param(r, id=r["id"]) for r in ROWS])
def test_free_search_is_never_slower_than_the_published_plan(row, outcomes):
    free = plan_row(row)
    assert free.best.estimate.step_time_s <= outcomes[row["id"]].predicted_step_s
