"""Clusters of several GPU types: the typed model, Sia's traces, the simulator, the policies
(unipar's, and our renderings of Sia and of Pollux as Sia ran it), `unipar simulate
--cluster` and bad input. About 8 s of CPU (2 cores), most of it three short simulations."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from unipar.cli.main import main
from unipar.errors import ConfigError
from unipar.sched.policies import TypedPolicyName, make_typed_policy
from unipar.sched.policies.pollux_unaware import _one_type, virtual_nodes
from unipar.sched.policies.sia import Config, configurations, solve
from unipar.sched.policies.typed_goodput import solve_assignment
from unipar.sched.traces import read_rows
from unipar.sched.typed_cluster import TypedAllocation, load_cluster, parse_cluster
from unipar.sched.typed_policy import TypedPolicy, TypedRoundState
from unipar.sched.typed_simulator import _Job, simulate_typed
from unipar.sched.typed_traces import (
    check_traced,
    load_typed_applications,
    placement_key,
)
from unipar.sched.workload import JobSpec, read_workload

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "sia"
SIA_CLUSTER = "6xaws+2xdgx-ext+3xrtx"


@pytest.fixture(scope="module")
def apps():
    return load_typed_applications(REFERENCE)


def _slice(apps, n=14) -> list[JobSpec]:
    """The first ``n`` jobs of Philly workload-1 but its day-long imagenet ones."""
    specs = read_workload(REFERENCE / "workloads/philly/workload-1.csv", apps)
    return [s for s in specs if s.application != "imagenet"][:n]


def test_cluster_spec_numbers_nodes_in_group_order():
    c = parse_cluster(SIA_CLUSTER)
    assert (c.total_gpus, c.num_nodes) == (64, 11)
    assert [c.gpus(t) for t in c.type_names] == [24, 16, 24]
    assert list(c.nodes_of("dgx-ext")) == [6, 7] and c.type_of(8).name == "rtx"
    assert c.scaled(16).total_gpus == 1024 and c.describe() == SIA_CLUSTER


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("6xaws+2xv100", r"cluster part '2xv100': unknown GPU type 'v100'; known: aws"),
        ("6aws", r"'6aws' .* is not NODESxTYPE"),
        ("2xaws+1xaws", r"\['aws'\] appear twice"),
        ("0xaws", r"'aws' needs at least one node, but got 0"),
    ],
)
def test_bad_cluster_specs_are_refused(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_cluster(text)


def test_a_cluster_file_defines_types_and_names_the_bad_row(tmp_path):
    good = tmp_path / "c.csv"
    good.write_text("type,nodes,gpus_per_node,memory_gib\naws,2,,\nh100,1,8,80\n")
    c = load_cluster(str(good))
    assert c.gpu_type("h100").gpus_per_node == 8 and c.total_gpus == 16
    bad = tmp_path / "bad.csv"
    bad.write_text("type,nodes\naws,2\nv100,4\n")
    with pytest.raises(ConfigError, match=r"bad.csv:3: unknown GPU type 'v100'"):
        load_cluster(str(bad))
    bad.write_text("type,nodes\naws,two\n")
    with pytest.raises(ConfigError, match=r"bad.csv:2: column 'nodes' must be a int"):
        load_cluster(str(bad))


def test_a_workload_row_without_a_trace_for_a_cluster_type_is_named(apps, tmp_path):
    ref = tmp_path / "ref"
    (ref / "traces" / "cifar10").mkdir(parents=True)
    for f in (REFERENCE / "traces" / "cifar10").iterdir():
        if "rtx" not in f.name:  # no trace of the rtx type
            shutil.copy(f, ref / "traces" / "cifar10" / f.name)
    few = load_typed_applications(ref)
    work = tmp_path / "w.csv"
    work.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,4,512\n")
    specs = read_workload(work, few)
    check_traced(specs, few, ("aws",), work)  # fine without rtx nodes
    with pytest.raises(ConfigError, match=r"w.csv:2: job 'a' is application 'cifar10', which "
                       r"has no trace for GPU type 'rtx'"):
        check_traced(specs, few, ("aws", "rtx"), work)


def test_ground_truth_reads_sia_traces(apps):
    app = apps["cifar10"]
    rows = read_rows(REFERENCE / "traces/cifar10/placements-aws.csv")
    row = next(r for r in rows if r["placement"] == "12" and float(r["local_bsz"]) == 64)
    # (2, 1) is the same spread as the measured "12" (smallest rotation)
    assert placement_key((2, 1)) == "12"
    assert app.trace("aws").step_time((2, 1), 64) == pytest.approx(
        (float(row["step_time"]), float(row["sync_time"])))
    val = read_rows(REFERENCE / "traces/cifar10/validation-512.csv")
    assert app.grad_stats(512, 3) == pytest.approx(
        (float(val[3]["grad_sqr"]), float(val[3]["grad_var"])))
    # between two measured batches: linear in the batch
    mid = app.grad_stats(384, 3)
    assert min(app.grad_stats(256, 3)[0], app.grad_stats(512, 3)[0]) <= mid[0]
    assert app.progress_at(0) == 0 and app.progress_at(100) == app.target_progress
    # memory: deepspeech2's per-GPU batch on a 2080Ti is at most 57
    assert apps["deepspeech2"].trace("rtx").max_local == 57
    assert apps["deepspeech2"].trace("dgx-ext").max_local == 320


class _Fixed(TypedPolicy):
    """Every job on the same GPUs, always."""

    name = "fixed"

    def __init__(self, alloc: TypedAllocation):
        self.alloc = alloc

    def allocate(self, state: TypedRoundState):
        return {j.name: self.alloc for j in state.jobs}


def test_a_job_progresses_at_the_measured_speed(apps):
    app = apps["bert"]  # an epoch is hours long: one round stays inside epoch 0
    job = _Job(JobSpec("b", 0.0, "bert", 8, 96), app)
    pools: dict = {}
    alloc = TypedAllocation("dgx-ext", ((6, 8),))
    job.assign(alloc, 0.0, _Fixed(alloc).batch_model, pools)
    assert job.restart_left == app.restart_seconds == 120
    for now in (0.0, 60.0):  # two rounds restoring its checkpoint: no progress
        job.advance(now, 60.0, _Fixed(alloc).batch_model, pools)
        assert job.progress == 0
    local, accum = job.local_bsz, job.accum
    job.advance(120.0, 60.0, _Fixed(alloc).batch_model, pools)
    batch = 8 * local * (accum + 1)
    step, sync = app.trace("dgx-ext").step_time((8,), local)
    sqr, var = app.grad_stats(batch, 0)
    gain = (var + sqr) / (var / (batch / app.init_batch) + sqr)
    speed = gain / (step + (step - sync) * accum) / app.slowdown
    assert job.progress == pytest.approx(speed * 60.0, rel=1e-9)
    assert job.attained == 3 * 8 * 60.0  # GPU-seconds held, restarts included


def test_a_restart_is_a_change_of_type_or_shape_not_of_nodes(apps):
    """Sia's simulator (job.py, Job.reallocate) restarts a job only when its GPUs per node
    or its type change; the same shape on other nodes trains on."""
    job = _Job(JobSpec("c", 0.0, "cifar10", 4, 512), apps["cifar10"])
    pools: dict = {}
    rule = _Fixed(TypedAllocation("rtx", ((8, 4),))).batch_model
    job.assign(TypedAllocation("rtx", ((8, 4),)), 0.0, rule, pools)
    job.advance(0.0, 60.0, rule, pools)
    assert (job.restarts, job.restart_left) == (0, 0)
    job.assign(TypedAllocation("rtx", ((9, 4),)), 60.0, rule, pools)  # other node, same shape
    assert (job.restarts, job.restart_left, job.allocation.nodes) == (0, 0, ((9, 4),))
    job.assign(TypedAllocation("rtx", ((9, 2), (10, 2))), 120.0, rule, pools)  # new shape
    assert (job.restarts, job.restart_left) == (1, 50)
    job.assign(TypedAllocation("aws", ((0, 2), (1, 2))), 180.0, rule, pools)  # new type
    assert (job.restarts, job.migrations) == (2, 1)


def test_sia_scales_only_a_held_jobs_speedups_by_its_reallocation_factor(apps):
    """Sia (sia.py, __solve_mip_rescaled) applies the factor only where a job has a
    previous configuration: a waiting job's speedups stay as they are."""
    policy = make_typed_policy(TypedPolicyName.SIA)
    cluster = parse_cluster(SIA_CLUSTER)
    configs = configurations(cluster)
    job = _Job(JobSpec("c", 0.0, "cifar10", 4, 512), apps["cifar10"])
    job.restarts = 3
    waiting = TypedRoundState(600.0, cluster, [job.view({}, cluster.type_names)])
    row = policy.speedups(waiting, configs)[0]
    assert row[[c.gpus == 1 for c in configs]].tolist() == [1.0, 1.0, 1.0]
    job.allocation = TypedAllocation("rtx", ((8, 1),))
    held = TypedRoundState(600.0, cluster, [job.view({}, cluster.type_names)])
    row = policy.speedups(held, configs)[0]
    factor = (600 - 3 * 30) / (600 + 30)  # Pollux's (T - R·δ)/(T + δ), δ = 30 s for cifar10
    one = [c.gpus == 1 for c in configs]
    assert row[one].tolist() == pytest.approx([factor, factor, 1.0])  # rtx is held


def test_every_policy_finishes_every_job_on_one_type_per_job(apps):
    specs = _slice(apps)
    cluster = parse_cluster("2xaws+1xdgx-ext+1xrtx")
    avg = {}
    for name in TypedPolicyName:
        run = simulate_typed(specs, apps, make_typed_policy(name), cluster)
        assert len(run.result.jobs) == len(specs)
        assert run.result.gpu_seconds == pytest.approx(sum(run.gpu_seconds_by_type.values()))
        avg[name] = run.result.avg_jct
    # unipar's policy: known applications start where they run best, shortest first
    assert avg[TypedPolicyName.UNIPAR] < avg[TypedPolicyName.SIA]


def test_sia_program_matches_brute_force():
    cluster = parse_cluster("1xaws+1xdgx-ext")
    configs = [c for c in configurations(cluster) if c.gpus <= 4]
    rng = np.random.default_rng(0)
    for _ in range(20):
        cost = rng.uniform(-1.2, 0.3, size=(3, len(configs)))
        got = solve(cost, configs, cluster, {})
        best = _brute(cost, configs, cluster, allow_none=True)
        assert sum(cost[i, c] for i, c in got.items()) == pytest.approx(best, abs=1e-3)


def test_unipar_program_matches_brute_force():
    cluster = parse_cluster("1xaws+1xdgx-ext")
    configs = [c for c in configurations(cluster) if c.gpus <= 4]
    rng = np.random.default_rng(1)
    for _ in range(20):
        cost = rng.uniform(0.1, 2.0, size=(3, len(configs)))
        cost[rng.random(cost.shape) < 0.2] = np.inf
        got = solve_assignment(cost, configs, cluster, {})
        best = _brute(cost, configs, cluster, allow_none=False)
        assert got is not None and len(got) == 3
        assert sum(cost[i, c] for i, c in got.items()) == pytest.approx(best, rel=1e-3)
    pinned = solve_assignment(cost, configs, cluster, {0: 1})
    assert pinned[0] == 1


def _brute(cost, configs: list[Config], cluster, allow_none: bool) -> float:
    options = range(-1 if allow_none else 0, len(configs))
    best = np.inf
    for pick in itertools.product(options, repeat=len(cost)):
        used = {t: 0 for t in cluster.type_names}
        total = 0.0
        for i, c in enumerate(pick):
            if c >= 0:
                used[configs[c].gpu_type] += configs[c].gpus
                total += cost[i, c]
        if all(used[t] <= cluster.gpus(t) for t in used):
            best = min(best, total)
    return best


def test_unaware_pollux_splits_big_nodes_and_keeps_the_majority_type():
    cluster = parse_cluster("1xaws+1xdgx-ext")
    vnodes = virtual_nodes(cluster)
    assert vnodes == [(0, 4), (1, 4), (1, 4)]
    # 4 GPUs on aws, 8 on the A100 node: the A100 ones stay
    assert _one_type(((0, 4), (1, 4), (2, 4)), vnodes, cluster) == ((1, 4), (2, 4))
    # a tie goes to the faster type
    assert _one_type(((0, 4), (1, 4)), vnodes, cluster) == ((1, 4),)


def test_cli_runs_a_typed_cluster_and_refuses_bad_input(apps, tmp_path, capsys):
    work = tmp_path / "w.csv"
    rows = ["name,time,application,num_replicas,batch_size"]
    rows += [f"{s.name},{s.submit_time},{s.application},{s.num_replicas},{s.batch_size}"
             for s in _slice(apps, 6)]
    work.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    code = main(["simulate", str(work), "--cluster", "1xaws+1xdgx-ext", "--policy", "sia",
                 "--out", str(out), "--no-plot"])
    text = capsys.readouterr().out
    assert code == 0 and "cluster 1xaws+1xdgx-ext (12 GPUs)" in text
    assert "sia: 6 jobs" in text and (out / "jobs.json").is_file()
    assert main(["simulate", str(work), "--cluster", "1xaws+1xv100"]) != 0
    assert "unknown GPU type 'v100'" in capsys.readouterr().err
    assert main(["simulate", str(work), "--cluster", "1xaws", "--policy", "tiresias"]) != 0
    assert "knows one GPU type" in capsys.readouterr().err


def test_sia_fallback_fill_keeps_pinned_jobs_and_capacity():
    """Where HiGHS runs out of time before any solution, Sia's round still answers."""
    from unipar.sched.policies.sia import _greedy

    cost = np.array([[-0.5, -0.9], [-0.8, -0.2], [-0.7, -0.6]])
    jobs, cols = np.nonzero(cost < 0)
    gpus = np.array([1.0, 4.0] * 3)
    kinds = np.zeros(6, dtype=int)
    out = _greedy(cost, jobs, cols, gpus, kinds, np.array([5.0]), {1: 1})
    # job 1 pinned on its 4 GPUs; of the rest by rising cost, job 0's 4 GPUs no longer fit,
    # job 2's one GPU does
    assert out == {1: 1, 2: 0}
