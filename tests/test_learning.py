"""The planner learns from measured runs, without Ray: the fit of the rate factors on
synthetic records (recovers known factors, bounded against outliers, ignores runs of an
overloaded machine, recent runs weigh more), the cluster fingerprint, the records'
cache round trip, the corrected cost model and the explanation that says so, and the
summary's prediction check. About 3 s on 2 cores."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from unipar.cli.calibrate import show
from unipar.cluster import cluster_preset
from unipar.cluster.corrections import Rate, base_cluster, corrected
from unipar.cluster.learned_fit import MAX_FACTOR, fit_factors, learned_cluster
from unipar.cluster.run_records import (
    KEEP_PER_CLUSTER,
    Measured,
    Observation,
    RunRecord,
    drop_records,
    fingerprint,
    read_records,
    records_file,
    records_for,
    store_record,
)
from unipar.models import GPTConfig
from unipar.plan import Plan
from unipar.plan.predict import MeasuredTimes, estimate_plan, observations, seconds_by_rate
from unipar.plan.report import model_profile, plan
from unipar.plan.strategy_search import search
from unipar.runtime.learn import PredictionCheck, steady_steps, summary_lines
from unipar.runtime.metrics import StepMetrics

A100 = cluster_preset("a100-80g")
TRUE = {Rate.COMPUTE: 0.7, Rate.PER_OP: 1.3, Rate.INTRA_NODE: 0.5, Rate.OPTIMIZER: 0.9}


def _record(seconds: dict[Rate, float], factors: dict[Rate, float], *, at: float = 0.0,
            load: float = 0.5, scale: float = 1.0, cluster: str = "c") -> RunRecord:
    """A run whose step the cost model split as ``seconds``, measured as the rates
    ``factors`` make it (times ``scale``: an odd run)."""
    predicted = sum(seconds.values())
    measured = scale * sum(s / factors.get(rate, 1.0) for rate, s in seconds.items())
    observation = Observation(Measured.STEP, measured, predicted, tuple(seconds.items()))
    return RunRecord(
        cluster=cluster, cluster_label="test", finished_at=at, job="job", plan="plan",
        workers=2, steps=20, predicted_s=predicted, measured_s=measured,
        load_average=load, cpus=2, observations=(observation,),
    )


def _plans(count: int, seed: int = 0) -> list[dict[Rate, float]]:
    """Plans that split their time differently among the groups (as a search's do)."""
    rng = np.random.default_rng(seed)
    weights = {Rate.COMPUTE: 1.0, Rate.PER_OP: 0.3, Rate.INTRA_NODE: 0.4, Rate.OPTIMIZER: 0.1}
    return [{rate: float(rng.uniform(0.05, 1) * w) for rate, w in weights.items()}
            for _ in range(count)]


def test_the_fit_recovers_known_factors():
    records = [_record(s, TRUE, at=i) for i, s in enumerate(_plans(8))]
    fitted = fit_factors(records)
    assert fitted.runs == 8 and fitted.kept_apart == 0
    for rate, value in TRUE.items():
        assert fitted.factors[rate] == pytest.approx(value, rel=0.02), rate
    # groups no run exercised stay as specified
    assert fitted.factors[Rate.FRAMEWORK] == fitted.factors[Rate.INTER_NODE] == 1.0


def test_one_run_puts_its_error_where_its_time_went():
    """A single run cannot tell the groups apart: its error goes to each group in
    proportion to its share of the time, and the run is then predicted right."""
    seconds = {Rate.COMPUTE: 0.8, Rate.INTRA_NODE: 0.15, Rate.OPTIMIZER: 0.05}
    record = _record(seconds, {}, scale=1.45)
    factors = fit_factors([record]).factors
    assert factors[Rate.COMPUTE] < factors[Rate.INTRA_NODE] < factors[Rate.OPTIMIZER] < 1
    predicted = sum(s / factors[rate] for rate, s in seconds.items())
    assert predicted == pytest.approx(record.measured_s, rel=0.01)


def test_a_run_is_predicted_right_again_when_its_forward_disagrees_with_its_step():
    """Time the model does not price (data loading, clipping, a backward slower than
    twice the forward) shows in the step, not in the traced forward: the step wins, and
    the unpriced time goes to compute, not to a link with a tiny share of the step."""
    step = {Rate.COMPUTE: 0.39, Rate.PER_OP: 0.006, Rate.INTRA_NODE: 0.003, Rate.OPTIMIZER: 0.002}
    forward = {Rate.COMPUTE: 0.13, Rate.PER_OP: 0.002}
    record = RunRecord(
        cluster="c", cluster_label="test", finished_at=0.0, job="job", plan="plan",
        workers=2, steps=180, predicted_s=0.401, measured_s=0.6, load_average=0.5, cpus=2,
        observations=(
            Observation(Measured.STEP, 0.6, 0.401, tuple(step.items())),
            Observation(Measured.FORWARD, 0.16, 0.132, tuple(forward.items())),
        ),
    )
    factors = fit_factors([record]).factors
    again = sum(s / factors[rate] for rate, s in step.items())
    assert again == pytest.approx(0.6, rel=0.02)
    assert factors[Rate.INTRA_NODE] > 0.8 and factors[Rate.COMPUTE] < 0.75


def test_outliers_move_the_factors_little_and_never_past_the_bound():
    records = [_record(s, TRUE, at=i) for i, s in enumerate(_plans(8))]
    odd = [_record(s, TRUE, at=10 + i, scale=40.0) for i, s in enumerate(_plans(2, seed=1))]
    fitted = fit_factors(records + odd)
    for rate, value in TRUE.items():
        assert fitted.factors[rate] == pytest.approx(value, rel=0.05), rate
    alone = fit_factors([_record(_plans(1)[0], {}, scale=1000.0)])
    assert all(1 / MAX_FACTOR <= f <= MAX_FACTOR for f in alone.factors.values())
    assert min(alone.factors.values()) == pytest.approx(1 / MAX_FACTOR)


def test_a_run_told_a_corrected_prediction_is_not_taken_for_an_odd_one():
    """Runs after the first were told corrected predictions, close to what they measured;
    what sets a run apart as odd is its measure against the model as specified."""
    records = [_record(s, {Rate.COMPUTE: 0.3}, at=i) for i, s in enumerate(_plans(4))]
    told = [records[0]] + [
        replace(r, predicted_s=r.measured_s * 1.05) for r in records[1:]  # corrected
    ]
    fitted = fit_factors(told)
    assert fitted.runs == 4 and fitted.factors[Rate.COMPUTE] == pytest.approx(0.3, rel=0.03)


def test_runs_of_an_overloaded_machine_are_kept_apart():
    quiet = [_record(s, TRUE, at=i) for i, s in enumerate(_plans(8))]
    loaded = [_record(s, {Rate.COMPUTE: 0.2}, at=20 + i, load=14.0)
              for i, s in enumerate(_plans(6, seed=2))]
    assert all(r.overloaded for r in loaded) and not any(r.overloaded for r in quiet)
    fitted = fit_factors(quiet + loaded)
    assert fitted.runs == 8 and fitted.kept_apart == 6
    assert fitted.factors[Rate.COMPUTE] == pytest.approx(TRUE[Rate.COMPUTE], rel=0.02)
    only_loaded = fit_factors(loaded)
    assert only_loaded.runs == 0 and set(only_loaded.factors.values()) == {1.0}


def test_recent_runs_weigh_more():
    """The same plans measured slower long ago and faster lately: the fit follows the
    recent ones."""
    plans = _plans(6)
    old = [_record(s, {Rate.COMPUTE: 0.5}, at=i) for i, s in enumerate(plans)]
    new = [_record(s, {Rate.COMPUTE: 0.8}, at=100 + i) for i, s in enumerate(plans)]
    assert fit_factors(old + new).factors[Rate.COMPUTE] == pytest.approx(0.8, rel=0.03)
    assert fit_factors(new + old).factors[Rate.COMPUTE] == pytest.approx(0.8, rel=0.03)


def test_the_fingerprint_is_the_device_its_count_layout_and_links():
    same = fingerprint(cluster_preset("a100-80g"))
    assert same == fingerprint(cluster_preset("a100-80g"))
    others = [
        cluster_preset("a100-80g", nodes=2),
        cluster_preset("a100-80g", devices_per_node=4),
        cluster_preset("a100-40g"),
        cluster_preset("a100-80g", attention="math"),
        replace(A100, intra_node=replace(A100.intra_node, bandwidth=1e9)),
        replace(A100, machine="host:0123"),
    ]
    keys = {fingerprint(c).key for c in others} | {same.key}
    assert len(keys) == len(others) + 1
    assert "1 x 8 A100-SXM4-80GB" in same.label
    # the corrections learned on a cluster do not make it another cluster
    assert fingerprint(corrected(A100, {Rate.COMPUTE: 0.5}, runs=3)) == same
    # and are not carried to another size
    assert corrected(A100, {Rate.COMPUTE: 0.5}, runs=3).resized(4).corrections is None


def test_records_round_trip_through_the_cache(tmp_path):
    record = _record({Rate.COMPUTE: 0.2, Rate.OPTIMIZER: 0.01}, TRUE,
                     cluster=fingerprint(A100).key)
    path = store_record(record, tmp_path)
    assert path == records_file(tmp_path, record.cluster)
    assert records_for(A100, tmp_path) == [record]
    assert records_for(cluster_preset("a100-80g", nodes=2), tmp_path) == []
    with path.open("a") as out:
        out.write("not json\n")  # a record cut short is skipped
    for i in range(2 * KEEP_PER_CLUSTER):
        store_record(replace(record, finished_at=float(i + 1)), tmp_path)
    kept = read_records(path)
    assert KEEP_PER_CLUSTER <= len(kept) <= 2 * KEEP_PER_CLUSTER
    assert kept[-1].finished_at == 2 * KEEP_PER_CLUSTER  # the newest are kept
    assert drop_records(tmp_path) == 1 and records_for(A100, tmp_path) == []


@pytest.fixture(scope="module")
def small_gpt():
    return model_profile(GPTConfig(vocab_size=256, seq_len=128, hidden=128, layers=4,
                                   heads=4).spec())


def test_shares_sum_to_the_prediction_and_price_the_corrected_cluster(small_gpt):
    """The cost model is homogeneous in the groups' times: the shares sum to the
    prediction, and where no overlap of communication with compute changes its regime
    (CPU workers) the corrected cluster's prediction is the shares over the factors (the
    linear model the fit assumes), for plans of every kind."""
    gpus = cluster_preset("a100-80g", devices_per_node=4, attention="math")
    cluster = replace(gpus, device=replace(gpus.device, overlaps_communication=False))
    factors = {Rate.COMPUTE: 0.6, Rate.PER_OP: 1.5, Rate.INTRA_NODE: 0.4, Rate.OPTIMIZER: 2.0}
    candidates = search(small_gpt, cluster, 32, keep=400).ranked
    kinds = {(c.plan.mesh.tp > 1, c.plan.mesh.pp > 1, c.plan.mesh.fsdp > 1) for c in candidates}
    assert len(kinds) >= 4  # tp, pp, fsdp and plain data parallel among them
    fixed = corrected(cluster, factors, runs=1)
    for candidate in candidates[::7]:
        value, shares = seconds_by_rate(small_gpt, candidate.plan, cluster)
        assert sum(s for _, s in shares) == pytest.approx(value, rel=1e-3)
        linear = sum(s / factors.get(rate, 1.0) for rate, s in shares)
        exact = estimate_plan(small_gpt, candidate.plan, fixed).step_time_s
        assert exact == pytest.approx(linear, rel=0.01), candidate.plan.mesh


def test_a_run_observes_its_step_forward_and_optimizer(small_gpt):
    cluster = cluster_preset("a100-80g", devices_per_node=2, attention="math")
    ddp = Plan.data_parallel(2, 32)
    found = observations(small_gpt, ddp, cluster, MeasuredTimes(0.3, 0.08, 0.01))
    assert [o.what for o in found] == [Measured.STEP, Measured.FORWARD, Measured.OPTIMIZER]
    forward = dict(found[1].seconds)
    assert forward[Rate.INTRA_NODE] == forward[Rate.OPTIMIZER] == 0  # compute alone
    assert dict(found[2].seconds)[Rate.COMPUTE] == 0
    flash = cluster_preset("a100-80g", devices_per_node=2)  # forward is not a third there
    assert [o.what for o in observations(small_gpt, ddp, flash, MeasuredTimes(0.3, 0.1))] == [
        Measured.STEP
    ]


def test_a_preset_with_no_runs_is_planned_as_specified(tmp_path, small_gpt):
    assert learned_cluster(A100, tmp_path) is A100
    bigger = cluster_preset("a100-80g", nodes=4)
    key = fingerprint(bigger).key
    for i, seconds in enumerate(_plans(3)):
        store_record(_record(seconds, TRUE, at=i, cluster=key), tmp_path)
    assert learned_cluster(A100, tmp_path) is A100  # runs of another size do not leak
    learned = learned_cluster(bigger, tmp_path)
    assert learned.corrections is not None and learned.corrections.runs == 3
    assert base_cluster(learned) == bigger
    spec = GPTConfig(vocab_size=256, seq_len=128, hidden=128, layers=4, heads=4).spec()
    text = plan(spec, learned, 64, profile=small_gpt).explain()
    assert "corrected from 3 runs on this cluster: compute x0." in text
    assert "corrected" not in plan(spec, bigger, 64, profile=small_gpt).explain()
    shown = "\n".join(show(tmp_path))
    assert "from 3 run(s); 0 kept apart" in shown and "compute x0." in shown


def _steps(count: int, seconds: float, *, attempt: int = 0, start: int = 0) -> list[StepMetrics]:
    return [
        StepMetrics(step=start + i, loss=1.0, lr=0.1, samples=8, tokens=8,
                    step_time_s=seconds * (5 if i == 0 else 1), tokens_per_s=1.0,
                    attempt=attempt, finished_at=float(i), predicted_step_s=0.2)
        for i in range(count)
    ]


def test_steady_steps_leave_out_each_attempts_warm_up():
    steady = steady_steps(_steps(30, 0.3) + _steps(10, 0.3, attempt=1, start=20))
    assert [m.step for m in steady][:3] == [3, 4, 5]  # 10% of 30 steps warm up
    assert {m.step for m in steady if m.attempt == 1} == set(range(22, 30))
    assert all(m.step_time_s == 0.3 for m in steady)


def test_the_summary_states_measured_against_predicted():
    check = PredictionCheck(2, "dp=2", 0.228, 0.3, (20, 199),
                            corrections="corrected from 1 run on this cluster: compute x0.76")
    text = "\n".join(summary_lines([check]))
    assert "measured 0.300 s (median of steps 20-199) against predicted 0.228 s" in text
    assert "error -24.0%" in text and "compute x0.76" in text
    assert math.isclose(check.error, 0.228 / 0.3 - 1)
    resized = summary_lines([check, replace(check, workers=4, predicted_s=None, note="why")])
    assert "2 workers: measured" in resized[0] and "4 workers: not predicted (why)" in resized[-1]


def test_the_suites_commands_keep_their_records_apart_from_the_machines(run_records_apart):
    """A command a test runs in a subprocess (``unipar train`` in the docs test, the
    service's runners) writes its run records where the suite's go, never into the
    machine's ``~/.cache/unipar``: there they would correct the planner of whoever runs
    the suite (they did: the docs test's runs, measured under the suite's load, put a
    later plain ``make demo``'s prediction 197% off). About 2 s."""
    import subprocess
    import sys

    code = "from unipar.cluster.run_records import records_dir; print(records_dir())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run_records_apart)


def test_a_residual_one_plans_own_mechanism_leaves_stays_with_it():
    """Plans of data parallelism and pipelines measured as the rates ``TRUE`` make them,
    and one tensor-parallel plan twice as slow as they would make it: its residual goes
    to the framework's time, which only it exercises, not to the compute, link and
    optimizer factors every plan carries (they stay as the other runs alone give them);
    and it is predicted right again."""
    data = {Rate.COMPUTE: 0.6, Rate.PER_OP: 0.1, Rate.INTRA_NODE: 0.25, Rate.OPTIMIZER: 0.05}
    pipeline = {Rate.COMPUTE: 0.7, Rate.PER_OP: 0.15, Rate.INTRA_NODE: 0.08, Rate.OPTIMIZER: 0.07}
    shared = [_record(data, TRUE, at=0), _record(pipeline, TRUE, at=1)]
    tensor = {Rate.COMPUTE: 0.5, Rate.PER_OP: 0.1, Rate.FRAMEWORK: 0.3, Rate.INTRA_NODE: 0.1}
    odd = _record(tensor, TRUE, at=5, scale=1.5)
    fitted, without = fit_factors([*shared, odd]), fit_factors(shared)
    assert fitted.runs == 3
    for rate in TRUE:
        assert fitted.factors[rate] == pytest.approx(without.factors[rate], rel=0.01), rate
    assert fitted.factors[Rate.FRAMEWORK] < 0.5
    again = sum(s / fitted.factors[rate] for rate, s in tensor.items())
    assert again == pytest.approx(odd.measured_s, rel=0.03)
