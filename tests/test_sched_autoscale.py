"""Autoscaling decisions (pure) and the cost floor against simulated runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from unipar.errors import ConfigError
from unipar.goodput.throughput import ThroughputModel
from unipar.sched.autoscale import ScaleConfig, ScaleRule, desired_nodes
from unipar.sched.bound import CostFloor
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import AutoscaleFleet
from unipar.sched.policies import PolicyName, make_policy
from unipar.sched.policy import Allocation, JobView
from unipar.sched.price import KEEP_MARGIN, hopeful_worth, priced_cost, priced_gpus
from unipar.sched.simulator import simulate
from unipar.sched.traces import load_applications
from unipar.sched.workload import read_workload

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pollux"


def _job(name: str, scalable: bool, seen: int = 8) -> JobView:
    """A job that speeds up linearly with GPUs (no sync cost, gradient all noise: gain = S),
    or one that gains nothing from them (sync-bound, gradient without noise: gain = 1)."""
    model = (ThroughputModel(0.0, 0.01) if scalable
             else ThroughputModel(0.0, 0.01, 5.0, 1.0, 10.0, 1.0))
    return JobView(
        name=name, submit_time=0.0, requested_replicas=1, requested_batch=32, init_batch=32,
        max_batch=4096, min_local=8, max_local=64, progress=0.0, attained_service=0.0,
        run_time=0.0, restarts=0, max_replicas_seen=seen, allocation=None, model=model,
        grad_sqr=0.0 if scalable else 1.0, grad_var=1.0 if scalable else 0.0,
    )


def _nodes(jobs, config, current=1, lo=1, hi=16):
    return desired_nodes(jobs, current, lo, hi, 4, config)


@pytest.mark.parametrize("rule", [ScaleRule.PRICE, ScaleRule.DEMAND])
def test_per_job_rules_grow_for_scalable_jobs_and_shrink_for_flat_ones(rule):
    scalable = [_job(f"s{i}", True) for i in range(2)]  # each may use 2 x 8 = 16 GPUs
    flat = [_job(f"f{i}", False) for i in range(3)]
    assert _nodes(scalable, ScaleConfig(rule)) == 8
    assert _nodes(flat, ScaleConfig(rule), current=16) == 1
    assert _nodes(scalable + flat, ScaleConfig(rule)) == 9  # 32 + 3 GPUs
    assert _nodes(scalable, ScaleConfig(rule), hi=5) == 5  # never past the maximum
    assert _nodes(flat, ScaleConfig(rule), lo=3) == 3  # nor under the minimum
    assert _nodes([], ScaleConfig(rule), current=7, lo=2) == 2


def test_a_higher_price_of_a_gpu_second_never_adds_nodes():
    # sublinear jobs: a cheap sync and noisy gradients, so more GPUs help less and less
    model = ThroughputModel(0.005, 0.01, 0.002, 0.001, 0.01, 0.002)
    jobs = [JobView(**{**_job(f"m{i}", True).__dict__, "model": model, "grad_sqr": 0.05,
                       "max_replicas_seen": 32}) for i in range(3)]
    counts = [_nodes(jobs, ScaleConfig(price=p)) for p in (0.0, 0.01, 0.1, 1.0, 10.0)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > counts[-1]


def test_utility_rule_keeps_its_size_inside_the_band_and_moves_to_the_middle_outside():
    flat = [_job(f"f{i}", False) for i in range(3)]  # 3 GPUs of speedup 1 each
    cfg = ScaleConfig(ScaleRule.UTILITY)
    assert _nodes(flat, cfg, current=2) == 2  # utility 3/8 in [0.35, 0.65]: kept
    assert _nodes(flat, cfg, current=8) == 2  # 3/32: shrink to the size nearest 0.5
    scalable = [_job(f"s{i}", True) for i in range(2)]  # speedup k up to 16 GPUs each
    assert _nodes(scalable, cfg, current=1) == 16  # utility 1 on 1..8 nodes; 32/64 = 0.5
    assert _nodes(scalable, cfg, current=12) == 16  # 32/48 = 0.67 > 0.65: grow
    assert _nodes(scalable, cfg, current=13) == 13  # 32/52 = 0.62: kept
    assert _nodes(scalable, ScaleConfig(ScaleRule.UTILITY, high=0.6), current=13) == 16


def test_bad_scale_config_is_refused():
    with pytest.raises(ConfigError, match="low <= high"):
        ScaleConfig(ScaleRule.UTILITY, low=0.8, high=0.5)
    with pytest.raises(ConfigError, match="price >= 0"):
        ScaleConfig(price=-1.0)


def test_the_fleet_decides_only_every_so_often():
    fleet = AutoscaleFleet(Cluster.uniform(16, 4), 1, ScaleConfig(every=300.0))  # five rounds
    scalable = [_job(f"s{i}", True) for i in range(2)]
    assert len(fleet.available_nodes(0.0, scalable)) == 8
    flat = [_job("f", False)]
    assert len(fleet.available_nodes(240.0, flat)) == 8  # not yet time to decide
    assert len(fleet.available_nodes(300.0, flat)) == 1


@pytest.fixture(scope="module")
def apps():
    return load_applications(REFERENCE)


def test_no_simulated_schedule_beats_the_cost_floor(apps):
    specs = read_workload(REFERENCE / "workloads-1.0/workload-1.csv", apps)
    specs = [s for s in specs if s.application != "imagenet"][:30]
    floor = CostFloor(specs, apps)
    policy = PolicyName.UNIPAR
    runs = [
        simulate(specs, apps, make_policy(policy), Cluster.uniform(16, 4)),
        simulate(specs, apps, make_policy(policy), Cluster.uniform(16, 4),
                 fleet=AutoscaleFleet(Cluster.uniform(16, 4), 1)),
        simulate(specs, apps, make_policy(PolicyName.TIRESIAS), Cluster.uniform(4, 4)),
    ]
    for r in runs:
        jct = float(r.jcts.sum())
        for lam in (0.0, 0.01, 0.1, 1.0):
            relaxed_jct, relaxed_gpu_s = floor.relaxed(lam)
            assert jct + lam * r.gpu_seconds >= relaxed_jct + lam * relaxed_gpu_s
        assert r.gpu_seconds >= floor.gpu_seconds(jct) > 0
    # and the floor is not vacuous: a good part of what the fixed cluster's run used
    assert floor.gpu_seconds(float(runs[0].jcts.sum())) > 0.3 * runs[0].gpu_seconds
    assert np.isfinite(floor.relaxed(0.1)).all()


def test_shrinking_releases_the_nodes_jobs_use_least():
    fleet = AutoscaleFleet(Cluster.uniform(16, 4), 1, ScaleConfig())
    assert fleet.available_nodes(0.0, [_job(f"s{i}", True) for i in range(2)]) == tuple(range(8))
    # one flat job left, running on node 5: the fleet keeps node 5, not node 0
    flat = JobView(**{**_job("f", False).__dict__, "allocation": Allocation(((5, 1),), 8)})
    assert fleet.available_nodes(60.0, [flat]) == (5,)
    # growing again adds the lowest-numbered free nodes
    assert fleet.available_nodes(120.0, [_job("s", True)]) == (0, 1, 2, 5)


def test_a_job_is_worth_the_gpus_whose_saving_beats_their_price():
    """(1 + λ·k)/goodput(k) (:mod:`unipar.sched.price`): a job that scales linearly is worth
    every GPU, a flat one a single GPU, a weak one fewer as λ grows; past the GPUs it ran
    on, its worth is hopeful (linear from there), and a held count within KEEP_MARGIN of
    the best stays.
    Pure numbers, milliseconds."""
    k = np.arange(1, 9, dtype=float)
    linear = k[None, :].copy()
    flat = np.ones((1, 8))
    allowed = np.ones((1, 8), dtype=bool)
    assert priced_gpus(linear, allowed, 0.01)[0] == 8
    assert priced_gpus(flat, allowed, 0.01)[0] == 1
    weak = (k**0.3)[None, :]  # the best k of (1 + λk)/k^0.3 is 0.3/(0.7λ)
    assert priced_gpus(weak, allowed, 0.1)[0] == 4 and priced_gpus(weak, allowed, 10.0)[0] == 1
    # fitted on 2 GPUs, the model sees no gain past them; the hope gives it 8
    pessimistic = np.minimum(k, 2.0)[None, :]
    assert priced_gpus(pessimistic, allowed, 0.01)[0] == 2
    assert hopeful_worth(pessimistic, allowed, np.array([2]), 0.01)[0] == 8
    # concave: at λ=0.1 8 GPUs are best, 6 and 7 cost within KEEP_MARGIN and stay if held
    concave = np.sqrt(k)[None, :] * 4
    cost = priced_cost(concave, allowed, 0.1)[0]
    best = int(np.argmin(cost)) + 1
    assert best == 8
    near = [c + 1 for c in range(8) if c + 1 != best and cost[c] <= cost.min() * (1 + KEEP_MARGIN)]
    far = [c + 1 for c in range(8) if cost[c] > cost.min() * (1 + KEEP_MARGIN)]
    seen = np.array([8])
    for held in near:
        assert hopeful_worth(concave, allowed, seen, 0.1, np.array([held]))[0] == held
    for held in far:
        assert hopeful_worth(concave, allowed, seen, 0.1, np.array([held]))[0] == best
    assert near and far
