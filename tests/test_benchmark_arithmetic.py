"""The benchmarks' arithmetic on fixed inputs, without running a benchmark: infinite and
missing times, negative overheads, failed jobs and unreached targets must never pass.

One test per benchmark (and the shared helper, benchmarks/measure.py). The benchmark
modules are imported, nothing is started: about 5-10 s on a 2-core machine, most of it
importing torch, Ray and xgboost once."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import measure
from measure import Spread, Verdict

INF, NAN = math.inf, math.nan


def test_measure_spread_ratio_verdict_and_result_line():
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert Spread.of([1.0, None, 2.0]).missing  # a failed repeat is not averaged away
    assert Spread.of([1.0, NAN]).missing
    assert Spread.of([]).missing
    assert Spread.of([1.0, INF, 2.0]).median == 2.0 and Spread.of([INF, INF]).median == INF
    assert measure.ratio(2.0, 4.0) == 0.5
    assert measure.ratio(INF, 4.0) == INF  # ours never got there
    for ours, peer in ((2.0, INF), (2.0, 0.0), (None, 1.0), (1.0, None), (-1.0, 1.0),
                       (NAN, 1.0), (INF, INF)):
        assert math.isnan(measure.ratio(ours, peer)), (ours, peer)
    assert measure.paired_ratios([1.0, 2.0], [2.0, None])[0] == 0.5
    with pytest.raises(ValueError, match="as many repeats"):
        measure.paired_ratios([1.0], [1.0, 2.0])
    assert measure.overhead(9.0, 10.0) == pytest.approx(0.1)
    assert measure.overhead(11.0, 10.0) == pytest.approx(-0.1)  # noise: shown as it is
    assert math.isnan(measure.overhead(None, 10.0))
    assert not measure.meets(NAN, 1.0) and not measure.meets(INF, 1.0)
    assert not measure.meets(Spread.of([None]), 1.0)
    assert measure.meets(0.5, 1.0) and measure.meets(2.0, 1.6, at_most=False)
    assert measure.max_relative_difference([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert measure.max_relative_difference([1.0], [1.0, 2.0]) == INF
    assert measure.max_relative_difference([NAN], [1.0]) == INF
    assert measure.max_relative_difference([], []) == INF


def test_a_loss_check_allows_the_references_own_rounding_drift_and_no_more():
    reference = [1.0, 0.5, 0.25, 0.2]
    twin = [1.0, 0.5, 0.25 * (1 + 1e-3), 0.2 * (1 - 1e-5)]  # drifts at step 2 and stays
    floor = measure.rounding_floor(reference, twin)
    assert floor == pytest.approx([0.0, 0.0, 1e-3, 1e-3])
    envelope = {"rtol": 1e-4, "factor": 10.0}
    drifted = [1.0, 0.5 * (1 + 5e-5), 0.25 * (1 + 5e-3), 0.2 * (1 - 9e-3)]
    assert measure.worst_over_envelope(drifted, reference, floor, **envelope) == \
        pytest.approx(0.9)  # step 3: 9e-3 of an allowance of 1e-2
    early = [1.0, 0.5 * (1 + 2e-4), 0.25, 0.2]  # before the drift: only rtol allowed
    assert measure.worst_over_envelope(early, reference, floor, **envelope) == \
        pytest.approx(2.0)
    wrong_batch = [1.0, 0.5, 0.25, 0.2 * 1.15]  # a late step's loss from another batch
    assert measure.worst_over_envelope(wrong_batch, reference, floor, **envelope) > 1.0
    assert measure.worst_over_envelope(reference[:3], reference, floor, **envelope) == INF
    assert measure.worst_over_envelope([NAN] * 4, reference, floor, **envelope) == INF
    with pytest.raises(ValueError, match="its twin"):
        measure.rounding_floor(reference, twin[:2])

    lines: list[str] = []
    verdict = Verdict(log=lines.append)
    verdict.target("ratio", Spread.of([0.5, 0.6, 0.7]), 0.8)
    assert verdict.finish({"ratio": Spread.of([0.5, 0.6, 0.7]), "n": 3, "note": "x"}) == 0
    assert lines[-1] == "RESULT ratio=0.600 ratio_min=0.500 ratio_max=0.700 n=3 note=x"
    missed = Verdict(log=lines.append)
    missed.target("ratio", NAN, 0.8)  # a missing figure misses its target
    assert missed.finish({"ratio": NAN}) == 1 and lines[-1] == "RESULT ratio=nan"
    quick = Verdict(quick=True, log=lines.append)
    quick.target("ratio", 2.0, 0.8)
    assert quick.finish({"ratio": 2.0}) == 0  # a smoke run's figures decide nothing ...
    quick.check(False, "losses equal")
    assert quick.finish({"ratio": 2.0}) == 1  # ... but its checks do
    assert measure.result_line({"x": INF, "y": -INF}) == "RESULT x=inf y=-inf"

    calls: list[str] = []

    def side(name: str, fail: bool = False):  # type: ignore[no-untyped-def]
        def run() -> str:
            calls.append(name)
            if fail:
                raise RuntimeError("side failed")
            return name

        return run

    out = measure.alternate({"a": side("a"), "b": side("b", fail=True), "c": side("c")}, 3,
                            log=lambda line: None)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # rotated each repeat
    assert out == {"a": ["a"] * 3, "b": [None] * 3, "c": ["c"] * 3}
    assert measure.order_of(["a", "b"], 1) == ["b", "a"]


def test_elastic_recovery_arithmetic():
    import elastic_recovery as er

    # steps 0..22 at 0.1 s, killed at 2.35; the survivor (1 worker) redoes 21, 22 slowly,
    # then the gang is back at 2 workers at full speed from t = 6.0
    ends = [er.StepEnd(s, 0.1 * (s + 1), 2) for s in range(23)]
    ends += [er.StepEnd(21, 3.0, 1), er.StepEnd(22, 3.5, 1), er.StepEnd(23, 4.0, 1)]
    ends += [er.StepEnd(24 + i, 6.0 + 0.1 * (i + 1), 2) for i in range(8)]
    got = er.recovery(ends, 2.35, full=2, kill_after=22, warmup=5, window=5)
    assert got.redone == 2
    assert got.next_step_s == pytest.approx(3.0 - 2.35)
    assert got.full_rate_s == pytest.approx(6.1 - 2.35)  # the first fast step's start
    slow = [*ends[:26], *(er.StepEnd(24 + i, 6.0 + 0.3 * i, 2) for i in range(8))]
    assert er.recovery(slow, 2.35, full=2, kill_after=22, warmup=5).full_rate_s == INF
    alone = [*ends[:26], *(er.StepEnd(24 + i, 6.0 + 0.1 * i, 1) for i in range(8))]
    assert er.recovery(alone, 2.35, full=2, kill_after=22, warmup=5).full_rate_s == INF
    never = er.recovery(ends[:23], 2.35, full=2, kill_after=22, warmup=5)
    assert never.next_step_s == INF and never.full_rate_s == INF  # nothing came after
    lines = [json.dumps({"step": 22, "finished_at": 1.0}),
             json.dumps({"event": "resize", "step": 23, "old": 2, "new": 1}),
             json.dumps({"step": 23, "finished_at": 2.0})]
    assert er.ends_from_metrics(lines, 2) == [er.StepEnd(22, 1.0, 2), er.StepEnd(23, 2.0, 1)]
    # steady runs: (end, duration); one 0.5 s snapshot between steps 5 and 6
    records = [(0.1 * (k + 1) + (0.5 if k >= 6 else 0.0), 0.09) for k in range(12)]
    run = er.steady_run(records, warmup=2)
    assert run.outside_steps_share == pytest.approx(0.5 / (records[-1][0] - 0.21))
    assert run.steps_per_s == pytest.approx(9 / (records[-1][0] - records[2][0]))
    assert math.isnan(er.steady_run(records[:3], warmup=2).steps_per_s)  # too few steps
    assert er.faster_peer([10.0, None, NAN], [8.0, 9.0, None]) == [8.0, 9.0, None]


def test_multi_job_failed_or_wrong_jobs_give_no_average():
    import multi_job as mj

    good = [mj.JobOutcome("a", True, 0.0, 10.0, True), mj.JobOutcome("b", True, 4.0, 8.0, True)]
    assert mj.policy_run(good) == mj.PolicyRun(7.0, 10.0)
    failed = [good[0], mj.JobOutcome("b", False, 4.0, None, True)]
    assert math.isnan(mj.policy_run(failed).avg_jct)  # a failed job cannot lower the average
    wrong = [good[0], mj.JobOutcome("b", True, 4.0, 5.0, False)]
    assert math.isnan(mj.policy_run(wrong).avg_jct)  # other losses than alone: not counted
    assert math.isnan(mj.policy_run([]).avg_jct)
    last = mj.arrivals(mj.ORDERS["long-last"], 0.5)
    assert [name for name, *_ in last][-1] == "long-4" and last[-1][2] == 400
    assert [at for *_, at in last] == [0.0, 4.0, 8.0, 12.0]
    assert mj.workers_for("fifo", 2) == (2, 2)
    assert mj.workers_for("fair", 4) == (1, 1)
    assert mj.workers_for("unipar", 2) == (1, 4)


def test_xgboost_models_compared_not_only_timed():
    import xgboost_vs_peers as xv

    labels = np.array([0.0, 1.0, 1.0, 0.0])
    reference = np.array([0.1, 0.8, 0.7, 0.3])
    assert xv.model_match(reference.copy(), reference, labels).ok
    assert xv.model_match(reference + 1e-7, reference, labels).ok
    other = xv.model_match(np.array([0.2, 0.6, 0.9, 0.3]), reference, labels)
    assert not other.ok and other.max_diff == pytest.approx(0.2)
    assert not xv.model_match(None, reference, labels).ok  # a failed run is no match
    assert not xv.model_match(reference[:3], reference, labels).ok
    assert xv.logloss(np.array([1.0]), np.array([1.0])) == pytest.approx(1e-15, abs=1e-12)
    assert xv.seconds_of([xv.SideRun(1.5, reference), None]) == [1.5, None]


def test_ddp_vs_torchrun_timing():
    import ddp_vs_torchrun as dt

    ends = [10.0 + 0.2 * k for k in range(20)]
    got = dt.timing(ends, [1.0] * 20, launched=6.0, warmup=5)
    assert got.steps_per_s == pytest.approx(5.0) and got.first_step_s == pytest.approx(4.0)
    few = dt.timing([10.0], [1.0], launched=6.0, warmup=5)
    assert math.isnan(few.steps_per_s)
    assert math.isnan(dt.timing([], [], launched=6.0, warmup=0).first_step_s)


def test_tune_asha_counts_steps_and_held_out_losses():
    import tune_asha as ta

    curves = {"a": ([1, 2, 3, 4], [3.0] * 4, "done"), "b": ([1, 2], [4.0] * 2, "stopped"),
              "c": ([], [], "error")}
    assert ta.steps_run(curves) == 6
    full = ta.Experiment(64, {"a": 2.0, "b": 2.5, "c": NAN})
    assert ta.best_held_out(full) == 2.0
    asha = ta.Experiment(16, {"a": 2.1})
    assert ta.gap(ta.best_held_out(asha), 2.0) == pytest.approx(0.05)
    assert math.isnan(ta.best_held_out(ta.Experiment(16, {})))  # no trial reached the end
    assert math.isnan(ta.gap(NAN, 2.0))
    assert ta.compute_ratios([asha, None], full) == [0.25, None]


def test_ps_vs_allreduce_time_lost():
    import ps_vs_allreduce as pv

    from unipar.plan.representation import GradSync

    times = {"ps": 1.0, "dense": 2.0, "sparse": 0.5}
    assert pv.time_lost(GradSync.PARAMETER_SERVER, times, ("ps", "dense")) == 0.0
    assert pv.time_lost(GradSync.ALL_REDUCE, times, ("ps", "dense")) == 1.0
    assert pv.time_lost(GradSync.PARAMETER_SERVER, times, pv.SIDES) == 1.0  # sparse was best
    assert math.isnan(pv.time_lost(GradSync.ALL_REDUCE, {**times, "dense": NAN},
                                   ("ps", "dense")))
    points = [(GradSync.PARAMETER_SERVER, times), (GradSync.ALL_REDUCE, times)]
    assert pv.mean_time_lost(points, ("ps", "dense")) == 0.5
    assert pv.ideal_speedup(8) == pytest.approx(16 / 9) and pv.ideal_speedup(4) == 1.6


def test_heterogeneous_ratios_use_the_uneven_plan_alone():
    import heterogeneous as he

    def case(predicted: float, measured: float) -> he.Case:
        return he.Case([1], [[0]], predicted, measured)

    cases = {he.UNEVEN: case(1.1, 1.0), he.EVEN: case(1.3, 1.5), he.FAST: case(2.0, 1.25),
             he.PER_CORE: case(1.0, 0.9)}
    got = he.round_ratios(cases)
    assert got["uneven_vs_even"] == pytest.approx(0.8)  # the better even split: fast only
    assert got["pred_err"] == pytest.approx(0.1)  # the uneven plan's own error, nothing else
    assert got["uneven_vs_one_per_core"] == pytest.approx(1 / 0.9)
    failed = he.round_ratios({**cases, he.UNEVEN: case(1.1, NAN)})
    assert math.isnan(failed["uneven_vs_even"]) and math.isnan(failed["pred_err"])
    # a failed alternative leaves no "better of the two even splits" to beat
    assert math.isnan(he.round_ratios({**cases, he.FAST: case(2.0, NAN)})["uneven_vs_even"])
    assert math.isnan(he.round_ratios({**cases, he.EVEN: case(1.3, NAN)})["uneven_vs_even"])
    # the losses check: a case that failed (no losses) or trained otherwise fails it
    trained = {name: he.Case([1], [[0]], 1.0, 1.0, (2.0, 1.5)) for name in cases}
    assert he.losses_check(trained) == 0.0
    assert he.losses_check({**trained, he.UNEVEN: case(1.0, NAN)}) == INF
    assert he.losses_check({**trained, he.FAST: he.Case([1], [[0]], 1.0, 1.0, (2.0, 1.65))}
                           ) == pytest.approx(0.1)
    # each kind of worker is the traced rank 0 once
    assert he.rank0_orders([[0], [0], [1]]) == [[[0], [0], [1]], [[1], [0], [0]]]
    assert he.rank0_orders([[0], [1]]) == [[[0], [1]], [[1], [0]]]
    assert he.rank0_orders([[1]]) == [[[1]]]


def test_plan_ranking_first_choice_gap_per_round():
    import plan_ranking as pr

    gap = pr.first_choice_gap([1.0, 1.1, 1.2], [1.0, 1.0, 1.0])
    assert (gap.median, gap.low, gap.high) == pytest.approx((0.1, 0.0, 0.2))
    assert pr.first_choice_gap([1.0, NAN], [1.0, 1.0]).missing  # a failed round
    assert pr.first_choice_gap([1.0, 1.0], [1.0, INF]).missing  # no fastest to compare with
    assert not measure.meets(pr.first_choice_gap([1.0], [0.9]), 0.05)  # 11% slower: a miss
    # a plan's record comes from the round whose time is the median (lower middle of even)
    assert pr.median_round([0.3, 0.1, 0.2]) == 2
    assert pr.median_round([0.4, 0.1, 0.3, 0.2]) == 3
    assert pr.median_round([0.5]) == 0
    # every round times every plan once, each round in an order of its own, repeatably
    orders = pr.round_orders(30, 3)
    assert all(sorted(order) == list(range(30)) for order in orders)
    assert len({tuple(order) for order in orders}) == 3
    assert pr.round_orders(30, 3) == orders


def test_plan_ranking_learns_from_pipeline_tensor_parallel_and_sharded_plans():
    """One each of pipeline, tensor parallel and sharded (between them every rate group),
    the middle of each kind's ranking; data parallel only as a 4th."""
    import plan_ranking as pr

    def candidate(pp: int = 1, tp: int = 1, fsdp: int = 1, dp: int = 1, index: int = 0):
        mesh = SimpleNamespace(pp=pp, tp=tp, fsdp=fsdp, dp=dp)
        return SimpleNamespace(plan=SimpleNamespace(mesh=mesh, index=index))

    ranked = [candidate(dp=2, index=i) for i in range(3)] + [
        candidate(fsdp=2, index=0), candidate(pp=2, index=0), candidate(tp=2, index=0),
        candidate(fsdp=2, index=1), candidate(pp=2, index=1), candidate(fsdp=2, index=2),
    ]
    chosen = pr.learning_plans(ranked, 3)  # the middle of each kind's ranking
    assert [id(c) for c in chosen] == [id(ranked[7]), id(ranked[5]), id(ranked[6])]
    assert pr.learning_plans(ranked, 4)[-1] is ranked[1]
    assert pr.learning_plans(ranked[:3], 3) == [ranked[1]]  # a kind absent is skipped


def test_sched_vs_pollux_ratios_and_length_views():
    import sched_vs_pollux as sp

    from unipar.sched.generate import resample_workload
    from unipar.sched.policies.lengths import declared_factor
    from unipar.sched.workload import JobSpec

    assert sp.ratio_of_means([1.0, 3.0], [2.0, 2.0]) == 1.0
    assert math.isnan(sp.ratio_of_means([1.0], [1.0, 2.0]))
    assert math.isnan(sp.ratio_of_means([1.0, NAN], [2.0, 2.0]))
    jct = {("0.5", 1): 1.0, ("1.0", 1): 3.0}
    ref = {("0.5", 1): 2.0, ("1.0", 1): 3.0}
    assert sp.per_load(jct, ref, ("0.5", "1.0"), (1,)) == {"0.5": 0.5, "1.0": 1.0}
    factors = [declared_factor(f"job-{i}", 0, 2.0) for i in range(200)]
    assert all(0.5 <= f <= 2.0 for f in factors) and min(factors) < 0.7 < 1.4 < max(factors)
    assert declared_factor("job-1", 0, 2.0) == declared_factor("job-1", 0, 2.0)
    assert declared_factor("job-1", 0, 2.0) != declared_factor("job-1", 1, 2.0)
    source = [JobSpec(f"a-{i}", float(10 * i), "cifar10", 1 + i % 4, 128) for i in range(20)]
    one, again = resample_workload([source], 1000), resample_workload([source], 1000)
    assert one == again and len(one) == 20 and one != resample_workload([source], 1001)
    assert [j.submit_time for j in one] == sorted(j.submit_time for j in one)
    assert len(resample_workload([source], 1, jobs=5)) == 5


def test_adaptive_batch_unreached_target_is_never_a_pass():
    import adaptive_batch as ab

    ratios = ab.task_ratios([10.0, 12.0], {8: [20.0, 20.0], 32: [INF, INF]}, init_batch=32)
    assert ratios.reached and ratios.vs_best.median == pytest.approx(0.55)
    assert ratios.vs_default.missing  # M0 never reached: no comparison, not a ratio of 0
    unreached = ab.task_ratios([INF, 12.0], {8: [20.0, 20.0], 32: [30.0, 30.0]}, init_batch=32)
    assert not unreached.reached and unreached.vs_best.high == INF
    assert not measure.meets(unreached.vs_best, 1.0)
    # the worse task of each figure; a missing one (nan) is the worst, never hidden
    assert ab.worst([Spread.of([1.2]), Spread.of([NAN]), Spread.of([0.9])]).missing
    assert ab.worst([Spread.of([1.2]), Spread.of([INF]), Spread.of([0.9])]).median == INF

    def steps(*medians: float) -> list:
        return [ab.Run("r", 1.0, 0.1, m, 32, m) for m in medians]

    held = ab.step_overhead(steps(1.1, 1.2, 0.9), steps(1.0, 1.0, 1.0))
    assert held.median == pytest.approx(0.1) and held.low == pytest.approx(-0.1)
    assert ab.step_overhead(steps(1.0), steps(0.0)).missing  # no timed step: no figure


def test_plan_ranking_rounds_map_back_to_their_plans(monkeypatch):
    """Whatever order each round runs its plans in, each plan gets its own times back."""
    import plan_ranking as pr

    def measure(world, schedule, steps, traced=frozenset()):
        return {(r, p): plan * 10.0 + r for r, plans in enumerate(schedule)
                for p, plan in enumerate(plans)}

    monkeypatch.setattr(pr, "measure", measure)
    for seed in (0, 1):
        seconds, records = pr.timed_rounds(2, [1, 2, 3, 4], rounds=3, steps=1, seed=seed)
        assert seconds == [[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [30.0, 31.0, 32.0],
                           [40.0, 41.0, 42.0]]
        assert records == [[[], [], []]] * 4
    assert pr.round_orders(4, 3, 0) != pr.round_orders(4, 3, 1)


def test_plan_ranking_times_again_what_a_dead_worker_left(monkeypatch):
    """A worker that dies costs the plans not yet timed fresh processes, not the run; the
    plan it died in is timed afresh, the others keep their times; a third death is
    raised."""
    import plan_ranking as pr

    died = pr.mp.ProcessExitedException
    calls = []

    def spawn(fn, args, nprocs, join):
        items, results = args[2], args[5]
        calls.append([(r, i) for r, i, _ in items])
        for r, i, _ in items[: 2 if len(calls) == 1 else None]:
            results[(r, i)] = float(10 * r + i)
        if len(calls) == 1:
            raise died("died", 1, 123, -11, "SIGSEGV")

    monkeypatch.setattr(pr.mp, "spawn", spawn)
    plans = [SimpleNamespace(to_json=lambda: "a"), SimpleNamespace(to_json=lambda: "b")]
    found = pr.measure(2, [plans, plans], steps=1)
    assert calls == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(1, 0), (1, 1)]]
    assert found == {(0, 0): 0.0, (0, 1): 1.0, (1, 0): 10.0, (1, 1): 11.0}

    def always_dies(fn, args, nprocs, join):
        raise died("died", 0, 1, -6, "SIGABRT")

    monkeypatch.setattr(pr.mp, "spawn", always_dies)
    with pytest.raises(died):
        pr.measure(2, [plans], steps=1)
