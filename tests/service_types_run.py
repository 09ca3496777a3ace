"""Run by test_service_types.py in its own process (its Ray's one node declares two node
types, which the session's Ray must not: every service test there would be scheduled by
type): a job that runs twice as fast on type b starts there; a second job, four times as
fast on b, arrives, and the policy moves the first to type a. Prints one JSON line with
what happened."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import ray
from test_service import mlp_job

from unipar.errors import ConfigError
from unipar.sched.policies import PolicyName
from unipar.service import client
from unipar.service.state import JobState

STEPS_ON_A = 10  # steps the moved job trains on type a before it is cancelled


def _wait(predicate, timeout_s: float = 120.0):  # type: ignore[no-untyped-def]
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out: {client.format_jobs(client.jobs())}")


def _texts(job_id: int) -> list[str]:
    return [text for _, text in client.call(client.scheduler().events.remote(job_id))]


def _moved_at(job_id: int) -> int | None:
    """The first step the job's workers ran holding type a (None: not yet)."""
    prefix = "workers hold node type a from step "
    return next((int(t[len(prefix):]) for t in _texts(job_id) if t.startswith(prefix)), None)


def main(workdir: Path) -> None:
    ray.init(address="local", num_cpus=3, resources={"unipar_type_a": 1, "unipar_type_b": 1},
             include_dashboard=False, logging_level=logging.WARNING)
    client.up(state_dir=workdir / "state", interval_s=0.5, policy=PolicyName.UNIPAR)
    try:
        client.submit(mlp_job("job-c", 10, seed=2), workers=1, throughput={"c": 1.0})
        refused = ""
    except ConfigError as error:
        refused = str(error)
    # long enough never to end before it is cancelled, whatever the machine's load
    x = client.submit(mlp_job("job-x", 5000, seed=0, delay=0.004), workers=1,
                      throughput={"a": 100.0, "b": 200.0}, checkpoint_every=10_000)
    _wait(lambda: x.status().step >= 5)
    y_submitted = time.time()
    y = client.submit(mlp_job("job-y", 30, seed=1, delay=0.004), workers=1,
                      throughput={"a": 100.0, "b": 400.0}, checkpoint_every=10_000)
    moved = _wait(lambda: _moved_at(x.id))
    _wait(lambda: x.status().step >= moved + STEPS_ON_A)
    x_row = x.cancel()
    y_row = y.wait(timeout_s=120)
    events = {str(h.id): client.call(client.scheduler().events.remote(h.id)) for h in (x, y)}
    # no `down`: this process's Ray, the scheduler's and the runners' processes with it,
    # ends with it (a down waits up to two rounds for the scheduler's loop)
    print(json.dumps({
        "refused": refused, "x": x.id, "y": y.id, "y_submitted": y_submitted,
        "events": events, "run_dirs": {str(r.id): r.run_dir for r in (x_row, y_row)},
        "y_state": y_row.state.value, "x_state": x_row.state.value,
        "y_done": y_row.state is JobState.DONE,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
