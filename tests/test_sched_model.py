"""Pure pieces of the scheduler: traces, throughput model, goodput, greedy, placement."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from unipar.goodput.table import JobArrays, goodput_table, split_batch
from unipar.goodput.throughput import Observation, ThroughputModel, fit
from unipar.sched.placement import place
from unipar.sched.policies.greedy import greedy
from unipar.sched.traces import default_reference_dir, load_applications

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pollux"


@pytest.fixture(scope="module")
def apps():
    assert default_reference_dir() == REFERENCE
    return load_applications(REFERENCE)  # CI has ../shared: a missing folder fails


def test_traces_match_the_measured_rows(apps):
    cifar = apps["cifar10"]
    row = (REFERENCE / "traces/cifar10/placements.csv").read_text().splitlines()[1].split(",")
    step, sync = cifar.step_time((int(row[0]),), int(row[1]))
    assert (step, sync) == pytest.approx((float(row[2]), float(row[3])))
    assert cifar.step_time((2, 4), 64) == cifar.step_time((4, 2), 64)  # order-free
    assert cifar.target_progress == pytest.approx(100 * cifar.progress_per_epoch)
    assert cifar.init_batch == 128 and cifar.max_batch == 4096
    assert apps["yolov3"].max_local_bsz == 8
    # beyond 4 nodes: interpolated between the scalability rows around it
    s5 = cifar.step_time((4,) * 5, 256)[0]
    lo, hi = cifar.step_time((4,) * 6, 256)[0], cifar.step_time((4,) * 4, 256)[0]
    assert min(lo, hi) * 0.5 < s5 < max(lo, hi) * 2


def test_gain_is_between_one_and_the_batch_scale(apps):
    for app in apps.values():
        for progress in (0.0, app.target_progress / 2):
            gain = app.gain(app.init_batch * 8, progress)
            assert 1.0 <= gain <= 8.0 + 1e-9
            assert app.gain(app.init_batch, progress) == pytest.approx(1.0)


def test_fit_recovers_a_known_model():
    true = ThroughputModel(0.02, 1e-3, 0.01, 0.004, 0.05, 0.01, 2.0)
    obs = [
        Observation(n, k, m, float(true.iter_time(n, k, m)), 0.0)
        for n, k in [(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)]
        for m in (32, 128)
    ]
    got = fit(obs)
    for o in obs:
        assert got.iter_time(o.nodes, o.replicas, o.local_bsz) == pytest.approx(
            o.step_time, rel=0.25
        )
    assert got.iter_time(1, 1, 64) == pytest.approx(float(true.iter_time(1, 1, 64)), rel=1e-6)


def test_split_batch_respects_the_per_gpu_limit():
    for batch, k, limit in [(640, 1, 80), (384, 12, 12), (4096, 6, 1024), (64, 4, 8)]:
        local, accum = split_batch(batch, k, limit)
        assert local <= limit
        assert local * k * (accum + 1) >= batch


def test_goodput_table_picks_the_best_batch_on_the_grid():
    model = ThroughputModel(0.01, 1e-3, 0.02, 0.001, 0.1, 0.01, 1.0)
    jobs = JobArrays(
        params=model.as_array()[None, :],
        grad_sqr=np.array([1.0]),
        grad_var=np.array([50.0]),
        init_batch=np.array([32.0]),
        max_batch=np.array([4096.0]),
        min_local=np.array([16.0]),
        max_local=np.array([256.0]),
        fixed_batch=np.array([128.0]),
        adaptive=np.array([True]),
    )
    table = goodput_table(jobs, 8, 4)
    k, m, s = 4, int(table.local_bsz[0, 3]), int(table.accum[0, 3])
    total = k * m * (s + 1)
    gain = (50 + 1) / (50 / (total / 32) + 1)
    assert table.goodput[0, 3] == pytest.approx(gain / float(model.iter_time(1, k, m, s)))
    for m2 in (16, 64, 256):  # no other batch on these points does better
        g2 = (51) / (50 / (k * m2 / 32) + 1) / float(model.iter_time(1, k, m2, 0))
        assert g2 <= table.goodput[0, 3] * (1 + 1e-9)


def test_greedy_matches_brute_force_on_convex_costs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        jobs, budget = 3, 7
        # speedups concave and increasing -> costs 1/speedup convex and decreasing
        inc = np.sort(rng.uniform(0.05, 1.0, (jobs, budget)), axis=1)[:, ::-1]
        speed = np.concatenate([np.zeros((jobs, 1)), np.cumsum(inc, axis=1)], axis=1) + 1
        cost = 1 / speed
        cost[:, 0] = np.inf
        got = greedy(cost, np.ones(jobs, dtype=int), budget - jobs)
        best = min(
            (sum(cost[j, a[j]] for j in range(jobs)), a)
            for a in itertools.product(range(1, budget + 1), repeat=jobs)
            if sum(a) <= budget
        )
        assert sum(cost[j, got[j]] for j in range(jobs)) == pytest.approx(best[0])


def test_placement_keeps_unchanged_jobs_and_consolidates():
    prev = {"a": ((0, 2),), "b": ((1, 4),)}
    out = place([("a", 2), ("b", 4), ("c", 8), ("d", 2)], prev, range(4), 4)
    assert out["a"] == ((0, 2),) and out["b"] == ((1, 4),)
    assert out["c"] == ((2, 4), (3, 4))  # two whole nodes
    assert out["d"] == ((0, 2),)  # best fit: the half-used node
    used = {}
    for nodes in out.values():
        for n, g in nodes:
            used[n] = used.get(n, 0) + g
    assert max(used.values()) <= 4
    # without spreading, a job that finds no room on one node is shrunk to the largest hole
    out = place([("x", 3), ("y", 3), ("z", 3)], {}, range(2), 4, spread=False)
    assert sorted(sum(g for _, g in v) for v in out.values()) == [3, 3]
