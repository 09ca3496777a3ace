"""The trace simulator, its policies, bad workloads and `unipar simulate`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from unipar.cli.main import main
from unipar.errors import ConfigError
from unipar.goodput.table import split_batch
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import AutoscaleFleet, make_fleet
from unipar.sched.policies import PolicyName, make_policy
from unipar.sched.simulator import SimConfig, simulate
from unipar.sched.traces import load_applications
from unipar.sched.workload import JobSpec, read_workload

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pollux"


@pytest.fixture(scope="module")
def apps():
    return load_applications(REFERENCE)


def _published(policy: str, workload: int) -> float:
    with (REFERENCE / "published_avg_jct.csv").open() as f:
        for r in csv.DictReader(f):
            if (r["policy"], r["load"], r["workload"]) == (policy, "1.0", f"workload-{workload}"):
                return float(r["avg_jct_s"])
    raise AssertionError("no published figure")


def _small(apps, n=24) -> list[JobSpec]:
    """The first ``n`` jobs of workload-1 that fit 16 GPUs, without the day-long imagenet."""
    specs = read_workload(REFERENCE / "workloads-1.0/workload-1.csv", apps)
    return [s for s in specs if s.application != "imagenet" and s.num_replicas <= 16][:n]


def test_a_lone_job_takes_its_measured_time(apps):
    app = apps["cifar10"]
    spec = JobSpec("solo", 0.0, "cifar10", 4, 1024)
    r = simulate([spec], apps, make_policy(PolicyName.FIFO), Cluster.uniform(2, 4))
    local, accum = split_batch(1024, 4, app.max_local_bsz)
    assert accum == 0
    step = app.step_time((4,), local)[0]
    # progress per step follows each epoch's gradient statistics; the start costs a restart
    per_epoch = app.progress_per_epoch
    ideal = 30.0 + sum(
        per_epoch * step / app.gain(1024, (e + 0.5) * per_epoch) for e in range(app.epochs)
    )
    assert r.jobs[0].jct == pytest.approx(ideal, rel=0.01)
    assert r.summary()["jobs"] == 1 and r.jobs[0].restarts == 0


@pytest.mark.parametrize("policy", list(PolicyName))
def test_every_policy_finishes_every_job_without_oversubscribing(apps, policy):
    specs = _small(apps)
    r = simulate(specs, apps, make_policy(policy), Cluster.uniform(4, 4))
    assert sorted(j.name for j in r.jobs) == sorted(s.name for s in specs)
    assert all(j.finish_time >= j.submit_time for j in r.jobs)
    assert all(sum(snap.values()) <= 16 for _, snap in r.timeline)
    assert 0 < r.utilisation <= 1.0


def test_tiresias_and_optimus_match_the_published_figures(apps):
    """Fidelity (the full 8-workload check is in benchmarks/sched_vs_pollux.py)."""
    for policy in (PolicyName.TIRESIAS, PolicyName.OPTIMUS):
        specs = read_workload(REFERENCE / "workloads-1.0/workload-2.csv", apps)
        r = simulate(specs, apps, make_policy(policy), Cluster.uniform(16, 4))
        assert r.avg_jct / _published(policy.value, 2) == pytest.approx(1.0, abs=0.15)


def test_goodput_policy_beats_the_fixed_baselines(apps):
    specs = _small(apps, 40)
    jct = {
        p: simulate(specs, apps, make_policy(p), Cluster.uniform(4, 4)).avg_jct
        for p in (PolicyName.UNIPAR, PolicyName.TIRESIAS, PolicyName.FIFO)
    }
    assert jct[PolicyName.UNIPAR] < jct[PolicyName.TIRESIAS] < jct[PolicyName.FIFO]


def test_quota_and_deadline(apps):
    specs = [
        JobSpec(f"j{i}", 0.0, "cifar10", 4, 2048, user="ann" if i < 3 else "bob") for i in range(6)
    ] + [JobSpec("urgent", 0.0, "cifar10", 4, 2048, deadline=1500.0)]
    config = SimConfig(gpu_quota=(("ann", 2),))
    r = simulate(specs, apps, make_policy(PolicyName.UNIPAR), Cluster.uniform(4, 4), config)
    ann = {s.name for s in specs if s.user == "ann"}
    assert all(sum(k for n, k in snap.items() if n in ann) <= 2 for _, snap in r.timeline)
    urgent = next(j for j in r.jobs if j.name == "urgent")
    assert urgent.met_deadline, urgent.jct


def test_autoscaling_saves_and_spot_loses_no_job(apps):
    specs = _small(apps)
    fixed = simulate(specs, apps, make_policy(PolicyName.UNIPAR), Cluster.uniform(16, 4))
    scaled = simulate(
        specs,
        apps,
        make_policy(PolicyName.UNIPAR),
        Cluster.uniform(16, 4),
        fleet=AutoscaleFleet(Cluster.uniform(16, 4), min_nodes=1),
    )
    assert scaled.cost < 0.7 * fixed.cost
    spot = simulate(
        specs,
        apps,
        make_policy(PolicyName.UNIPAR),
        Cluster.uniform(16, 4),
        fleet=make_fleet(Cluster.uniform(16, 4), None, spot_rate=2.0, seed=1),
    )
    assert len(spot.jobs) == len(specs)
    assert spot.summary()["preemptions"] > 0
    assert spot.cost < fixed.cost


def _write(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "w.csv"
    path.write_text("\n".join(["name,time,application,num_replicas,batch_size", *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (["a,0,cifar10,4,1024", "b,xx,cifar10,4,1024"], r"w\.csv:3: column 'time'"),
        (["a,0,resnet,4,1024"], r"w\.csv:2: unknown application 'resnet'"),
        (["a,0,cifar10,4"], r"w\.csv:2: a row needs exactly the 5 columns"),
        (["a,0,cifar10,100,1024"], r"w\.csv:2: job 'a' asks for 100 GPUs .* at most 64"),
        (["a,0,cifar10,0,1024"], r"w\.csv:2: column 'num_replicas' must be positive"),
        (["a,0,cifar10,4,1024", "a,1,cifar10,4,1024"], r"w\.csv:3: job name 'a' appears twice"),
    ],
)
def test_bad_workloads_name_the_row(apps, tmp_path, rows, match):
    with pytest.raises(ConfigError, match=match):
        read_workload(_write(tmp_path, rows), apps, max_gpus=64)


def test_cli_prints_and_writes(tmp_path, capsys):
    path = _write(tmp_path, ["a,0,cifar10,4,1024", "b,30,ncf,1,32768", "c,90,bert,4,96"])
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            str(path),
            "--policy",
            "unipar",
            "--nodes",
            "2",
            "--reference",
            str(REFERENCE),
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "avg JCT" in text and "p99 JCT" in text and "GPU utilisation" in text
    data = json.loads((out / "jobs.json").read_text())
    assert [j["name"] for j in data["jobs"]] == ["a", "b", "c"]
    assert (out / "sim.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    path = _write(tmp_path, ["a,0,cifar10,4,1024", "b,0,cifar10,20,1024"])
    code = main(
        [
            "simulate",
            str(path),
            "--nodes",
            "4",
            "--reference",
            str(REFERENCE),
            "--out",
            str(tmp_path),
            "--no-plot",
            "--policy",
            "tiresias",
        ]
    )
    assert code == 2
    assert "w.csv:3" in capsys.readouterr().err


def test_cli_autoscale_prints_cost_against_the_fixed_cluster_and_the_floor(tmp_path, capsys):
    """Three jobs on up to 2 nodes (a few seconds): the autoscaled cost and JCT over the
    fixed 2 nodes', and the floor, which the autoscaled cost is not under."""
    path = _write(tmp_path, ["a,0,cifar10,4,1024", "b,30,ncf,1,32768", "c,90,bert,4,96"])
    code = main(["simulate", str(path), "--nodes", "2", "--autoscale", "1:2", "--no-plot",
                 "--reference", str(REFERENCE), "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert code == 0
    line = next(x for x in text.splitlines() if x.startswith("against the fixed 2 nodes"))
    cost = float(line.split("cost x")[1].split()[0])
    floor = float(line.split("floor of any schedule at avg JCT <= x1.1: x")[1])
    assert 0 < floor <= cost


def test_each_round_admits_arrivals_skips_idle_time_and_stops_at_the_horizon():
    """The round start both simulators share (unipar.sched.arrivals)."""
    from types import SimpleNamespace

    from unipar.errors import ConfigError
    from unipar.sched.arrivals import admit_arrivals

    def job(name, at):
        return SimpleNamespace(spec=SimpleNamespace(name=name, submit_time=at))

    pending, active = [job("a", 10.0), job("b", 130.0)], []
    assert admit_arrivals(pending, active, 0.0, 60.0, 1000.0, hint="") == 60.0  # idle: skip
    assert admit_arrivals(pending, active, 60.0, 60.0, 1000.0, hint="") is None
    assert [j.spec.name for j in active] == ["a"] and len(pending) == 1
    unfinished = r"horizon of 100 s with 2 jobs unfinished \(e.g. 'a'\).*fits"
    with pytest.raises(ConfigError, match=unfinished):
        admit_arrivals(pending, active, 180.0, 60.0, 100.0, hint=": check that each job fits")
