"""The shared cluster's scheduler service: pure rounds and bad input without Ray, then one
live scenario on the session's 4-CPU Ray: job A runs on 4 workers, B arrives and A
shrinks, the scheduler's process is SIGKILLed and Ray starts it again, the new one adopts
both running jobs, A ends and B grows; each job's losses equal its run alone.

Losses equal a single-process run of the same global batch and samples within rtol 1e-5:
the workers compute the same samples, only the order of the gradient sums differs.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray.cloudpickle
import torch
from reference_loop import single_process_losses

from unipar.errors import ConfigError
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.runtime.metrics import read_metrics
from unipar.sched.policies import PolicyName, make_policy
from unipar.service import client
from unipar.service.decide import (
    ResizeCost,
    grow_pays,
    step_time,
    targets,
    useful_workers,
    worker_sizes,
)
from unipar.service.state import JobRow, JobState, Store
from unipar.testing import SlowRegression, mse_loss

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def mlp_job(name: str, steps: int, seed: int, delay: float = 0.005) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(
        name=name,
        model=functools.partial(MLP, config),
        dataset=functools.partial(SlowRegression, 512, 16, 4, delay, seed),
        global_batch_size=8,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-2),
        loss=mse_loss,
        seed=seed,
    )


def _refuse_to_load() -> None:
    raise RuntimeError("this dataset cannot be loaded in the runner")


class Unloadable:
    """A dataset factory that pickles on the client; unpickling it (in the job's runner)
    raises."""

    def __call__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("never built: the runner cannot load the job")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_refuse_to_load, ())


def _row(job_id: int, state: JobState, **fields) -> JobRow:  # type: ignore[no-untyped-def]
    base = dict(id=job_id, name="mlp", user="u", priority=0, deadline=None, least=1, most=4,
                sizes=(1, 2, 4), batch=8, steps=100, state=state, submitted=float(job_id))
    return JobRow(**{**base, **fields})


# -- pure ------------------------------------------------------------------------------------


def test_rounds_share_and_give_back():
    a = _row(1, JobState.RUNNING, started=1.0, target=4, workers=4, step=10, max_seen=4,
             step_times={4: (10, 1.0)})
    b = _row(2, JobState.QUEUED)
    ours, fifo = make_policy(PolicyName.UNIPAR), make_policy(PolicyName.FIFO)
    assert targets(ours, [a], 4, 10.0, 1.0) == {1: 4}  # alone: all of it
    shared = targets(ours, [a, b], 4, 10.0, 1.0)
    assert shared[1] < 4 and shared[2] >= 1 and sum(shared.values()) <= 4
    assert targets(fifo, [a, b], 4, 10.0, 1.0) == {1: 4, 2: 0}  # FIFO: B waits
    assert targets(ours, [b], 4, 10.0, 1.0) == {2: 4}  # A ended: B takes it all
    # a size the job's batch cannot split over is never handed out
    assert set(targets(ours, [_row(3, JobState.QUEUED, sizes=(1, 2, 4))], 3, 0, 1).values()) \
        == {2}


def test_a_job_whose_least_size_is_above_one_starts():
    """The goodput policy gives a job it has not seen run one worker; a job that takes
    no fewer than 2 (or 4) starts on its least size all the same, not queued forever."""
    ours = make_policy(PolicyName.UNIPAR)
    for least in (2, 4):
        job = _row(1, JobState.QUEUED, least=least, most=least, sizes=(least,))
        assert targets(ours, [job], 4, 10.0, 1.0) == {1: least}
    running = _row(1, JobState.RUNNING, started=1.0, target=2, workers=2, step=10,
                   max_seen=2, least=2, most=2, sizes=(2,), step_times={2: (10, 1.0)})
    fixed = _row(2, JobState.QUEUED, least=2, most=2, sizes=(2,))
    assert targets(ours, [running, fixed], 4, 10.0, 1.0) == {1: 2, 2: 2}
    assert targets(ours, [running, fixed], 3, 10.0, 1.0) == {1: 2, 2: 0}  # no room: waits
    # a busy cluster: two running jobs hold every worker; the policy starts B, and they
    # shrink toward their least sizes to make the room B's least size needs
    times = {4: (10, 0.4)}
    a = _row(1, JobState.RUNNING, started=1.0, target=4, workers=4, max_seen=4, steps=1000,
             step=10, step_times=times)
    c = _row(3, JobState.RUNNING, started=2.0, target=4, workers=4, max_seen=4, steps=1000,
             step=10, step_times=times)
    b = _row(2, JobState.QUEUED, least=4, most=4, sizes=(4,))
    assert targets(ours, [a, b, c], 8, 10.0, 1.0) == {1: 2, 2: 4, 3: 2}


def test_a_job_about_to_end_is_not_shrunk():
    """A running job that ends within a resize's latency keeps its size: the job the
    policy gives its room starts all the same and takes the room when it ends. (The
    moment of the shared-cluster benchmark when its fourth job arrives.)"""
    ours = make_policy(PolicyName.UNIPAR)
    long = _row(1, JobState.RUNNING, target=1, workers=1, max_seen=2, steps=400, step=60,
                step_times={2: (20, 1.0), 1: (10, 0.9)})
    ending = _row(2, JobState.RUNNING, target=2, workers=2, max_seen=2, steps=60, step=8,
                  step_times={2: (5, 0.27)})  # 52 steps of 0.054 s left: 2.8 s
    starting = _row(3, JobState.RUNNING, target=1, steps=150)
    new = _row(4, JobState.QUEUED, steps=60)
    jobs = [long, ending, starting, new]
    # a resize that took no time: the policy shares the 4 workers out, one each
    assert targets(ours, jobs, 4, 12.0, 1.0, ResizeCost(latency=0.0)) == {1: 1, 2: 1, 3: 1,
                                                                          4: 1}
    # a new worker takes 5 s to start: the ending job keeps 2, the new one starts on 1
    assert targets(ours, jobs, 4, 12.0, 1.0, ResizeCost(latency=5.0)) == {1: 1, 2: 2, 3: 1,
                                                                          4: 1}


def test_a_running_job_grows_only_when_the_resize_pays():
    """Growing costs the measured latency (the gang trains on at its size meanwhile) and a
    pause: a job that has little left, or would gain too little, keeps its size."""
    cost = ResizeCost(latency=4.0, pause=2.0)
    times = {2: (20, 2.0), 4: (20, 1.0)}  # 0.1 s per step on 2 workers, 0.05 on 4
    many = _row(1, JobState.RUNNING, steps=1000, step=100, target=2, step_times=times)
    few = _row(2, JobState.RUNNING, steps=1000, step=900, target=2, step_times=times)
    # (900 - 40) steps x 0.05 s saved > 2 s; (100 - 40) x 0.05 = 3 s > 2 s; 10 left: no
    assert grow_pays(many, 4, cost) and grow_pays(few, 4, cost)
    assert not grow_pays(replace(few, step=990), 4, cost)
    assert not grow_pays(few, 4, ResizeCost(latency=4.0, pause=4.0))  # 3 s saved < 4 s
    assert grow_pays(_row(3, JobState.RUNNING, target=1), 2, cost)  # no speeds yet: try
    once = _row(4, JobState.RUNNING, target=1, step_times={1: (10, 1.0)})
    assert step_time(once, 2) == pytest.approx(0.05)  # one size seen: scaled perfectly
    assert step_time(few, 1) == pytest.approx(0.2)  # two seen: the fitted line T = a + b·M/k
    ours = make_policy(PolicyName.UNIPAR)
    near_end = replace(few, step=990, max_seen=4)
    assert targets(ours, [near_end], 4, 10.0, 1.0, cost) == {2: 2}  # the rest idles
    assert targets(ours, [replace(many, max_seen=4)], 4, 10.0, 1.0, cost) == {1: 4}


def test_left_over_workers_go_to_the_job_with_the_least_time_left():
    times = {1: (20, 2.0), 2: (20, 1.0)}
    old = _row(1, JobState.RUNNING, steps=1000, step=0, target=1, max_seen=1,
               step_times=times)
    young = _row(2, JobState.RUNNING, steps=300, step=0, target=1, max_seen=1,
                 step_times=times, submitted=5.0)
    out = targets(make_policy(PolicyName.UNIPAR), [old, young], 3, 10.0, 1.0)
    assert out == {1: 1, 2: 2}  # the later but shorter job takes the third worker


def test_resize_cost_is_the_median_measured():
    assert ResizeCost.measured([], []) == ResizeCost()
    assert ResizeCost.measured([3.0, 9.0, 5.0], [1.0]) == ResizeCost(latency=5.0, pause=1.0)
    with pytest.raises(ConfigError, match=r"ResizeCost.pause must be >= 0.*-1"):
        ResizeCost(pause=-1.0)


def test_autoscaler_request_counts_the_workers_that_pay_off():
    """A job that scales asks for up to twice the size it was seen at (within its most);
    one no faster on 2 workers than on 1 is flat, and asks for 2 at most (its goodput per
    worker there is half its goodput on one: Pollux's bound, inclusive)."""
    scales = _row(1, JobState.RUNNING, name="fast", most=8, sizes=(1, 2, 4, 8), target=2,
                  max_seen=2, step_times={1: (10, 1.0), 2: (10, 0.5)})
    stalls = _row(2, JobState.RUNNING, name="slow", target=2, max_seen=2,
                  step_times={1: (10, 1.0), 2: (10, 1.5)})
    assert useful_workers([scales], 0.0, 16) == 4
    assert useful_workers([stalls], 0.0, 16) == 2
    assert useful_workers([scales, stalls], 0.0, 16) == 6
    assert useful_workers([], 0.0, 16) == 0


def test_the_autoscaler_request_is_withdrawn_at_down_and_after_a_takeover(ray_cluster, tmp_path):
    """A request to Ray's autoscaler stands until replaced: ``unipar down`` withdraws it,
    and so does a scheduler that took over from a lost one (which did not know it)."""
    import json

    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    from unipar.service.scheduler import Scheduler

    def requested() -> int:
        raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        return len(json.loads(raw)) if raw else 0

    first = Scheduler(str(tmp_path / "a"), "unipar", 600.0)
    first._ask_autoscaler(8)
    assert requested() == 8
    first.shutdown()
    assert requested() == 0
    lost = Scheduler(str(tmp_path / "b"), "unipar", 600.0)
    lost._ask_autoscaler(8)
    lost._stop.set()  # its process is gone: nothing withdraws its request
    lost._wake.set()
    successor = Scheduler(str(tmp_path / "b"), "unipar", 600.0)
    successor.round_now()  # no job: nothing pays off
    assert requested() == 0
    successor.shutdown()


class StandInRunner:
    """Answers as a runner that is still starting (no steps yet)."""

    def status(self):  # type: ignore[no-untyped-def]
        from unipar.service.runner import RunnerStatus

        return RunnerStatus()

    def set_target(self, target: int, decided: float, resources=None) -> None:  # type: ignore[no-untyped-def]
        pass


def test_a_start_adopts_a_runner_left_unrecorded_and_a_failed_start_fails_one_job(
    ray_cluster, tmp_path
):
    """A scheduler killed between making a job's runner and recording it leaves a runner
    under the job's name: the next start adopts it. A job whose start raises fails alone;
    the round goes on."""
    from unipar.service.scheduler import NAMESPACE, Scheduler

    scheduler = Scheduler(str(tmp_path), "fifo", 600.0)
    left = None
    try:
        blob = ray.cloudpickle.dumps((b"a pickled job", {}))
        broken = scheduler.submit(_row(0, JobState.QUEUED, least=1, most=1, sizes=(1,)),
                                  b"not a pickle")
        name = f"unipar-job-{scheduler.token}-{broken + 1}"
        left = ray.remote(StandInRunner).options(
            name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0).remote()
        adopted = scheduler.submit(_row(0, JobState.QUEUED, least=1, most=1, sizes=(1,)),
                                   blob)
        assert adopted == broken + 1
        _wait(lambda: all(scheduler.store.row(i).state is not JobState.QUEUED
                          for i in (broken, adopted)), timeout_s=30)
        failed, running = scheduler.store.row(broken), scheduler.store.row(adopted)
        assert failed.state is JobState.FAILED and "failed to start" in \
            scheduler.store.events(broken)[-1][1]
        assert running.state is JobState.RUNNING
        assert "adopted the runner a lost scheduler had started" in [
            text for _, text in scheduler.store.events(adopted)]
        assert ray.get(scheduler.runners[adopted].status.remote()).step == 0
    finally:
        scheduler.shutdown()
        if left is not None:
            ray.kill(left, no_restart=True)


def test_a_job_starts_with_its_whole_range_beyond_the_cluster(ray_cluster, tmp_path):
    """A job of 1:8 workers on a 4-CPU cluster: its runner runs ``fit`` over the whole range
    (the size target bounds it), so nodes an autoscaler adds later are grown into. Before,
    the range was cut to what the cluster held at the start, and the job never grew."""
    from unipar.service.scheduler import Scheduler

    scheduler = Scheduler(str(tmp_path), "unipar", 600.0)
    try:
        job = mlp_job("wide", 40, seed=0)
        blob = ray.cloudpickle.dumps((ray.cloudpickle.dumps(job), {}))
        job_id = scheduler.submit(_row(0, JobState.QUEUED, least=1, most=8, sizes=(1, 2, 4, 8)),
                                  blob)
        log = scheduler._log_path(job_id)
        _wait(lambda: log.exists() and "workers, global batch" in log.read_text(), timeout_s=60)
        assert "on 1..8 workers" in log.read_text()
        assert 0 < scheduler.store.row(job_id).target <= 4
    finally:
        scheduler.shutdown()


def test_worker_sizes_and_deadlines():
    assert worker_sizes(1, 8, 12) == (1, 2, 3, 4, 6)
    with pytest.raises(ConfigError, match="divides the global batch 7"):
        worker_sizes(2, 6, 7)
    now = 1_800_000_000.0  # 2027
    assert client.parse_deadline("+2h", now) == now + 7200
    with pytest.raises(ConfigError, match=r"in the past.*\+2h"):
        client.parse_deadline("2001-01-01T00:00", now)
    with pytest.raises(ConfigError, match="ISO 8601"):
        client.parse_deadline("tomorrow", now)
    with pytest.raises(ConfigError, match="must not exceed"):
        client.check_workers((4, 2))


def _step(step: int, seconds: float, batch: int | None = None, progress: float = 0.0,
          efficiency: float = 1.0):  # type: ignore[no-untyped-def]
    from unipar.adapt.state import AdaptStats
    from unipar.runtime.metrics import StepMetrics

    adapt = None if batch is None else AdaptStats(batch, 20.0, efficiency, 0.0, 0.7, progress)
    return StepMetrics(step, 1.0, 1e-3, batch or 32, 0, seconds, 0.0, 0, 100.0 + step,
                       adapt=adapt)


def test_an_adaptive_job_reports_progress_in_steps_of_its_initial_batch():
    """An adaptive job (M0 32) at batch 8 with efficiency 2 makes half a step of M0's
    progress per step (r = S·E): the runner reports its progress, not its steps, and
    seconds per step of progress, so its place in the table and its time left are those of
    its own end (progress = steps)."""
    from unipar.service.decide import remaining_s
    from unipar.service.ledger import WARMUP_STEPS, RunnerStatus, StepLedger

    adaptive = StepLedger(RunnerStatus(), batch=32)
    for i in range(10):  # a step's stats hold the progress before it
        adaptive.step(_step(i, 0.05, batch=8, progress=0.5 * i, efficiency=2.0), size=2)
    status = adaptive.status
    assert status.step == 5 and status.batch == 8
    timed = 10 - WARMUP_STEPS
    assert status.step_times == {2: pytest.approx((0.5 * timed, 0.05 * timed))}
    assert status.steps_per_s == pytest.approx(10.0)
    row = _row(1, JobState.RUNNING, batch=32, steps=100, step=status.step, target=2,
               workers=2, step_times=status.step_times, steps_per_s=status.steps_per_s,
               running_batch=status.batch)
    assert remaining_s(row) == pytest.approx(95 * 0.1)  # 95 steps of M0 at 0.1 s each
    table = client.format_jobs([row])
    assert "8 (M0 32)" in table and "5/100 (5%)" in table and "320.0/s" in table

    fixed = StepLedger(RunnerStatus(), batch=32)
    for i in range(10):
        fixed.step(_step(i, 0.05), size=2)
    assert fixed.status.step == 10 and fixed.status.batch == 32
    assert fixed.status.step_times == {2: pytest.approx((timed, 0.05 * timed))}


def test_a_store_written_by_an_older_unipar_gains_the_new_columns(tmp_path):
    import sqlite3

    from unipar.service.state import _COLUMNS

    store = Store(tmp_path / "s.sqlite")
    job_id = store.add(_row(0, JobState.QUEUED), b"job")
    store.close()
    old = [c for c in _COLUMNS if c not in ("running_batch", "error", "steps_per_s")]
    db = sqlite3.connect(str(tmp_path / "s.sqlite"))  # the table as an older unipar made it
    db.executescript(f"CREATE TABLE old AS SELECT {', '.join(old)}, job FROM jobs; "
                     "DROP TABLE jobs; ALTER TABLE old RENAME TO jobs;")
    db.close()
    row = Store(tmp_path / "s.sqlite").row(job_id)
    assert row is not None and row.batch == 8
    assert (row.running_batch, row.error, row.steps_per_s) == (0, "", 0.0)
    assert isinstance(row.steps_per_s, float)


def test_store_keeps_jobs_and_history(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    job_id = store.add(_row(0, JobState.QUEUED), b"job")
    store.update(job_id, state=JobState.RUNNING, step_times={2: (3, 1.5)})
    store.event(job_id, "started")
    token = store.token()
    store.close()
    again = Store(tmp_path / "s.sqlite")  # as a restarted scheduler reads it
    row = again.row(job_id)
    assert row is not None and row.state is JobState.RUNNING and row.step_times == {2: (3, 1.5)}
    assert [text for _, text in again.events(job_id)] == ["started"]
    assert again.token() == token and again.job(job_id) == b"job"
    assert "0/100 (0%)" in client.format_jobs([row])


def test_bad_submissions_are_refused_before_touching_a_cluster(tmp_path, capsys):
    """No cluster recorded (a fresh process), a job file with no ``job``, a deadline in
    the past: each a clear error, nothing started."""
    from unipar.cli.main import main
    from unipar.job_file import load_job

    code = "import sys; from unipar.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "submit", "gpt-stdlib", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2 and "no cluster to submit to" in done.stderr, done.stderr
    assert "run `unipar up` first" in done.stderr
    empty = tmp_path / "no-job.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"must define `job`.*defines no `job`"):
        load_job(str(empty))
    assert main(["submit", "gpt-stdlib", "--deadline", "2001-01-01T00:00"]) == 2
    assert "deadline must be ahead of now" in capsys.readouterr().err


# -- live ------------------------------------------------------------------------------------


def _wait(predicate, timeout_s: float = 90.0):  # type: ignore[no-untyped-def]
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            value = predicate()
        except Exception:  # the scheduler may be restarting
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out: {client.format_jobs(client.jobs())}")


def _by_id(job_id: int) -> JobRow:
    return next(r for r in client.jobs() if r.id == job_id)


@pytest.fixture(scope="module")
def shared_run(ray_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    state = tmp_path_factory.mktemp("service")
    client.up(state_dir=state, interval_s=0.5, policy=PolicyName.UNIPAR)
    # B's samples are slow enough that, once A ends, growing it pays for the resize; A's
    # leave it well over a grow's latency (5 s until measured) to run when B arrives, else
    # it would keep its size as a job about to end
    jobs = {"a": mlp_job("job-a", 240, seed=0, delay=0.015),
            "b": mlp_job("job-b", 320, seed=1, delay=0.02)}
    a = client.submit(jobs["a"], workers=(1, 4), checkpoint_every=10_000)
    _wait(lambda: (r := _by_id(a.id)).workers == 4 and r.step >= 10)
    b = client.submit(jobs["b"], workers=(1, 4), checkpoint_every=10_000)
    shrunk = _wait(lambda: (r := _by_id(a.id)).workers < 4 and r)
    # SIGKILL the scheduler's process while both run; Ray starts it again (max_restarts=-1)
    scheduler = client.scheduler()
    running = [r.id for r in client.jobs() if r.state is JobState.RUNNING]
    old_pid = client.call(scheduler.ping.remote())["pid"]
    os.kill(old_pid, signal.SIGKILL)
    restarted = _wait(lambda: client.call(scheduler.ping.remote(), 5)["pid"] != old_pid)
    done = [h.wait(timeout_s=150) for h in (a, b)]
    history = {h.id: client.call(scheduler.events.remote(h.id)) for h in (a, b)}
    rows = client.jobs()
    log_b = b.logs()
    with pytest.raises(ConfigError, match="no job 999"):
        client.cancel(999)
    with pytest.raises(ConfigError, match="already ended"):
        client.cancel(a.id)
    broken = replace(mlp_job("job-c", 10, seed=2), dataset=Unloadable())
    unloadable = client.submit(broken, workers=(1, 4)).wait(timeout_s=60)
    client.down()
    yield dict(jobs=jobs, handles=(a, b), shrunk=shrunk, running=running, done=done,
               history=history, rows=rows, restarted=restarted, log_b=log_b,
               unloadable=unloadable)


def test_jobs_share_the_cluster_and_match_their_runs_alone(shared_run):
    a, b = shared_run["handles"]
    assert shared_run["shrunk"].workers < 4  # B arrived, A shrank
    assert all(r.state is JobState.DONE for r in shared_run["done"])
    b_texts = [text for _, text in shared_run["history"][b.id]]
    # A ended and B grew past the size it had beside A
    grew = [t for t in b_texts if t.startswith("resize ")]
    assert grew and "resources free" in grew[-1], b_texts
    a_texts = [text for _, text in shared_run["history"][a.id]]
    assert any("size target" in t for t in a_texts), a_texts
    for handle, key in ((a, "a"), (b, "b")):
        job = shared_run["jobs"][key]
        row = next(r for r in shared_run["rows"] if r.id == handle.id)
        records = read_metrics(Path(row.run_dir) / "metrics.jsonl")
        assert [r["step"] for r in records] == list(range(job.steps))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model: more threads only contend (57 s vs 1.4 s)
        try:
            alone, _ = single_process_losses(mlp_job(job.name, job.steps, job.seed, delay=0.0))
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(torch.tensor([r["loss"] for r in records]),
                                   torch.tensor(alone), rtol=1e-5, atol=1e-6)


def test_a_job_whose_runner_cannot_start_fails_with_the_reason(shared_run):
    row = shared_run["unloadable"]
    assert row.state is JobState.FAILED
    assert "its runner could not start" in row.error
    assert "RuntimeError: this dataset cannot be loaded in the runner" in row.error


def test_a_killed_scheduler_comes_back_and_adopts_the_running_jobs(shared_run):
    assert shared_run["restarted"]
    assert len(shared_run["running"]) == 2  # both ran when the scheduler was killed
    for handle in shared_run["handles"]:
        texts = [text for _, text in shared_run["history"][handle.id]]
        # the full history, from before the kill and after it
        assert texts[0].startswith("submitted by")
        assert sum(t.startswith("started on") for t in texts) == 1  # never started again
        assert "adopted by a restarted scheduler" in texts
        assert texts[-1] == "done"
        assert not any("worker lost" in t for t in texts)  # the jobs went on
    assert [r.state for r in shared_run["rows"]] == [JobState.DONE, JobState.DONE]
    assert "unipar run summary" in shared_run["log_b"]
