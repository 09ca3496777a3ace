"""The shared cluster's service on a cluster of several node types (issue 40, point 4).

Pure: the node types a Ray cluster declares, the typed policy's rounds as the service
runs them (a job goes to the type its declared goodput prefers; it moves when a job that
gains more from that type arrives, and not for one that gains less), the per-type step
times the runner counts, and a declaration naming an unknown type.

Live (``service_types_run.py``, in its own process: its Ray's node declares the types
``unipar_type_a`` and ``unipar_type_b``, which the session's Ray must not, or every
service test would be scheduled by type): X, twice as fast on b, starts on b; Y, four times
as fast on b, arrives; the policy moves X to a and Y takes b. Where each job ran is read
from the resources Ray assigned its worker processes, not from the scheduler's intent.
X's losses across the move, and Y's, equal their single-process runs (rtol 1e-5, as the
service's other parity tests). 30 to 51 s on 2 cores shared at load averages of 4 to 10
(not measured quiet yet), most of it process start-up: its own Ray, the scheduler, two runners
and three workers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from own_cluster import run_scenario
from reference_loop import single_process_losses
from test_service import mlp_job

from unipar.errors import ConfigError
from unipar.runtime.metrics import StepMetrics
from unipar.sched.policies.typed_goodput import TypedGoodputPolicy
from unipar.service.client import format_jobs
from unipar.service.decide_typed import Placement, declared_profile, typed_targets
from unipar.service.ledger import WARMUP_STEPS, RunnerStatus, StepLedger
from unipar.service.node_types import check_throughput, type_held, type_resource, typed_cluster
from unipar.service.state import JobRow, JobState, Store

GIB = 2**30
ONE_NODE = [{"Alive": True, "Resources": {"CPU": 3.0, "memory": 6.0 * GIB,
                                          "unipar_type_a": 1.0, "unipar_type_b": 1.0}}]


def _row(job_id: int, state: JobState, **fields) -> JobRow:  # type: ignore[no-untyped-def]
    base = dict(id=job_id, name=f"job-{job_id}", user="u", priority=0, deadline=None,
                least=1, most=1, sizes=(1,), batch=8, steps=200, state=state,
                submitted=float(job_id))
    return JobRow(**{**base, **fields})


def test_node_types_come_from_the_resources_nodes_declare():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8.0, "memory": 32.0 * GIB, "unipar_type_a100": 4.0}},
        {"Alive": True, "Resources": {"CPU": 8.0, "memory": 16.0 * GIB, "unipar_type_a100": 2.0}},
        {"Alive": True, "Resources": {"CPU": 4.0, "unipar_type_t4": 4.0}},
        {"Alive": False, "Resources": {"CPU": 4.0, "unipar_type_t4": 4.0}},  # gone
        {"Alive": True, "Resources": {"CPU": 4.0}},  # no type
    ]
    cluster = typed_cluster(nodes)
    assert cluster is not None and cluster.describe() == "2xa100+1xt4"
    assert cluster.gpu_type("a100").gpus_per_node == 2  # no room promised that a node lacks
    assert cluster.gpu_type("a100").memory_gib == pytest.approx(8.0)  # per worker
    assert cluster.gpus("a100") == 4 and cluster.gpus("t4") == 4
    assert typed_cluster([{"Alive": True, "Resources": {"CPU": 4.0}}]) is None
    assert type_resource("b") == {"unipar_type_b": 1.0} and type_resource("") == {}
    assert type_held({"CPU": 1.0, "unipar_type_b": 1.0}) == "b"
    assert type_held({"CPU": 1.0}) == ""


def test_a_job_goes_to_the_type_its_goodput_prefers_and_moves_for_one_that_gains_more():
    cluster = typed_cluster(ONE_NODE)
    policy = TypedGoodputPolicy()  # the simulator's policy object, as the service runs it
    x = _row(1, JobState.QUEUED, throughput={"a": 100.0, "b": 200.0})
    assert typed_targets(policy, [x], cluster, 1.0, 0.5) == {1: Placement("b", 1)}
    # X ran 30 steps on b (0.05 s each); Y, four times as fast on b, arrives: b goes to Y
    running = _row(1, JobState.RUNNING, throughput={"a": 100.0, "b": 200.0}, started=2.0,
                   target=1, workers=1, gpu_type="b", step=40,
                   typed_step_times={"b": {1: (30.0, 1.5)}}, step_times={1: (30.0, 1.5)})
    gains_more = _row(2, JobState.QUEUED, submitted=8.0, throughput={"a": 100.0, "b": 400.0})
    assert typed_targets(policy, [running, gains_more], cluster, 10.0, 0.5) == {
        1: Placement("a", 1), 2: Placement("b", 1)}
    # one that gains less from b (1.5x) than X (2x) leaves X where it is
    gains_less = _row(2, JobState.QUEUED, submitted=8.0, throughput={"a": 100.0, "b": 150.0})
    assert typed_targets(policy, [running, gains_less], cluster, 10.0, 0.5) == {
        1: Placement("b", 1), 2: Placement("a", 1)}
    # a third job finds no free worker of any type: it waits
    third = _row(3, JobState.QUEUED, submitted=9.0, throughput={"a": 100.0, "b": 400.0})
    out = typed_targets(policy, [running, gains_more, third], cluster, 10.0, 0.5)
    assert sorted(p.workers for p in out.values()) == [0, 1, 1]
    # a type the job does not name counts as its slowest named one; none named: all alike
    assert declared_profile(_row(4, JobState.QUEUED, throughput={"b": 50.0, "c": 80.0}),
                            ("a", "b", "c")) == {"a": 50.0, "b": 50.0, "c": 80.0}
    assert declared_profile(_row(5, JobState.QUEUED), ("a", "b")) == {"a": 1.0, "b": 1.0}


def test_an_unknown_node_type_is_refused_naming_the_job_the_type_and_the_known_ones():
    assert check_throughput("x", {"a": 1, "b": 2.5}, ("a", "b")) == {"a": 1.0, "b": 2.5}
    assert check_throughput("x", None, ()) is None
    with pytest.raises(ConfigError, match=r"job 'x' declares a throughput for node type 'c'.*"
                       r"its node types: 'a', 'b'.*unipar_type_c"):
        check_throughput("x", {"a": 1.0, "c": 2.0}, ("a", "b"))
    with pytest.raises(ConfigError, match=r"node type 'a'.*its node types: none"):
        check_throughput("x", {"a": 1.0}, ())
    with pytest.raises(ConfigError, match=r"job 'x'.*on node type 'b' must be a positive.*-1"):
        check_throughput("x", {"b": -1}, ("a", "b"))


def test_the_runner_counts_step_times_per_type_its_workers_hold(tmp_path):
    ledger = StepLedger(RunnerStatus(), batch=8)
    for step in range(6):
        ledger.step(StepMetrics(step, 1.0, 1e-2, 8, 0, 0.1, 0.0, 0, 100.0 + step), 1, "b")
    ledger.resized()
    for step in range(6, 12):
        ledger.step(StepMetrics(step, 1.0, 1e-2, 8, 0, 0.2, 0.0, 0, 100.0 + step), 1, "a")
    status = ledger.status
    timed = 6 - WARMUP_STEPS
    assert status.placements == [(0, "b"), (6, "a")] and status.gpu_type == "a"
    assert status.typed_step_times == {"b": {1: pytest.approx((timed, 0.1 * timed))},
                                       "a": {1: pytest.approx((timed, 0.2 * timed))}}
    assert status.steps_per_s == pytest.approx(5.0)  # its speed on a, where it runs now
    moving = _row(0, JobState.RUNNING, target=1, workers=1, gpu_type="a", held_type="b")
    assert "1/1 on b->a" in format_jobs([moving])
    assert "1/1 on a" in format_jobs([replace(moving, held_type="a")])
    store = Store(tmp_path / "s.sqlite")  # the columns go to the store and back
    job_id = store.add(_row(0, JobState.RUNNING, throughput={"a": 1.0, "b": 2.0},
                            typed_step_times=status.typed_step_times, gpu_type="a"), b"job")
    again = store.row(job_id)
    assert again.throughput == {"a": 1.0, "b": 2.0} and again.gpu_type == "a"
    assert again.typed_step_times == {t: {k: tuple(v) for k, v in times.items()}
                                      for t, times in status.typed_step_times.items()}


def _losses(run_dir: str) -> tuple[list[int], list[float]]:
    """Steps and losses in the order the run wrote them (a step done twice would show);
    a last line cut short by the cancel is left out."""
    records = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    steps = [r for r in records if "event" not in r]
    return [r["step"] for r in steps], [r["loss"] for r in steps]


def _alone(name: str, steps: int, seed: int) -> list[float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    try:
        return single_process_losses(mlp_job(name, steps, seed, delay=0.0))[0]
    finally:
        torch.set_num_threads(threads)


def test_a_job_starts_on_its_preferred_type_and_moves_when_the_policy_says(tmp_path):
    outcome, _ = run_scenario("service_types_run.py", tmp_path, timeout_s=300)
    assert "job 'job-c'" in outcome["refused"] and "node type 'c'" in outcome["refused"]
    assert "its node types: 'a', 'b'" in outcome["refused"]
    x, y = str(outcome["x"]), str(outcome["y"])
    x_events = outcome["events"][x]
    texts = [t for _, t in x_events]
    # (a) placed on b, and Ray's assignment to its worker process says so
    assert "started on 1 workers of node type b" in texts
    assert texts.index("workers hold node type b from step 0") < texts.index("node type b -> a")
    # (b) it moves when the policy says so: not before Y arrives, then at a step boundary
    decided = next(when for when, t in x_events if t == "node type b -> a")
    assert decided >= outcome["y_submitted"]
    assert not any(t.startswith("node type") for when, t in x_events if when < decided)
    resize = next(t for t in texts if "moved to unipar_type_a" in t)
    step = int(resize.split(" at step ")[1].split(":")[0])
    assert f"workers hold node type a from step {step}" in texts
    assert texts.index(resize) > texts.index("node type b -> a")
    y_texts = [t for _, t in outcome["events"][y]]
    assert "started on 1 workers of node type b" in y_texts
    assert "workers hold node type b from step 0" in y_texts and outcome["y_done"]
    # (c) the losses of its run alone, across the move (and Y's)
    for job_id, name, seed in ((x, "job-x", 0), (y, "job-y", 1)):
        steps, losses = _losses(outcome["run_dirs"][job_id])
        assert steps == list(range(len(steps))), steps  # none lost, none done twice
        if job_id == x:
            assert len(steps) > step  # it trained on a after the move
        torch.testing.assert_close(torch.tensor(losses),
                                   torch.tensor(_alone(name, len(steps), seed)),
                                   rtol=1e-5, atol=1e-6)
