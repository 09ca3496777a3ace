"""Talking to the shared cluster's scheduler: ``up``, ``submit``, ``jobs``, ``logs``,
``cancel``, ``down``, and the :class:`JobHandle` that ``submit`` returns.

Every input is checked before the cluster is touched; a bad one, or a cluster with no
scheduler, raises a :class:`~unipar.errors.UniparError` naming the rule, the value and a
fix. In a process where Ray already runs (a test, a notebook on the cluster) that Ray
instance is used; otherwise ``address``, else the address ``unipar up`` recorded in the
state directory.
"""

from __future__ import annotations

import datetime
import getpass
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from unipar import checks
from unipar.errors import ConfigError, ResourceError, UniparError
from unipar.ray_cluster.address import check_address
from unipar.ray_cluster.session import start_ray
from unipar.runtime.config import RunConfig, submit_fields, worker_range
from unipar.sched.policies import PolicyName
from unipar.service.decide import worker_sizes
from unipar.service.node_types import check_throughput, typed_cluster
from unipar.service.scheduler import NAMESPACE, SCHEDULER_NAME, Scheduler, cluster_slots, head
from unipar.service.state import JobRow, JobState

if TYPE_CHECKING:
    from unipar.job import Job

DEFAULT_STATE_DIR = Path.home() / ".unipar"
DEFAULT_INTERVAL_S = 10.0
_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(text: str | float | None, now: float | None = None) -> float | None:
    """A deadline as unix seconds: ``+30m``/``+2h``/``+1d``, an ISO 8601 time
    (``2026-11-24T09:00``, local time unless it names its offset) or unix seconds.
    A deadline not ahead of ``now`` is refused."""
    if text is None:
        return None
    now = time.time() if now is None else now
    if isinstance(text, (int, float)):
        when = float(text)
    elif match := _RELATIVE.match(text.strip()):
        when = now + float(match[1]) * _UNIT_S[match[2]]
    else:
        try:
            when = datetime.datetime.fromisoformat(text.strip()).timestamp()
        except ValueError:
            raise ConfigError(
                f"a deadline is +N followed by s, m, h or d (+2h), or an ISO 8601 time "
                f"(2026-11-24T09:00), but got {text!r}"
            ) from None
    if when <= now:
        raise ConfigError(
            f"the deadline must be ahead of now, but {text!r} "
            f"({_stamp(when)}) is {now - when:.0f} s in the past (now {_stamp(now)}); "
            "give a later time, or a relative one such as +2h"
        )
    return when


def _stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when).isoformat(timespec="seconds")


def check_workers(workers: int | tuple[int, int]) -> tuple[int, int]:
    least, most = worker_range(workers)
    most = checks.integer("workers", most, minimum=1)
    least = most if least is None else checks.integer("the fewest workers", least, minimum=1)
    if least > most:
        raise ConfigError(
            f"the fewest workers must not exceed the most, but got {least}:{most}; pass "
            f"--workers {most}:{least}"
        )
    return least, most


# -- the cluster and its scheduler -----------------------------------------------------------


def connect(address: str | None = None, state_dir: Path | None = None) -> None:
    """Join the cluster: this process's Ray, else ``address``, else the one ``unipar up``
    recorded in ``state_dir``."""
    if ray.is_initialized():
        return
    recorded = (state_dir or DEFAULT_STATE_DIR) / "cluster"
    if address is None:
        if not recorded.is_file():
            raise ResourceError(
                f"no cluster to submit to: no --address given and `unipar up` has not "
                f"recorded one here ({recorded} does not exist); run `unipar up` first, or "
                "pass --address HOST:PORT of a cluster where it ran"
            )
        address = recorded.read_text().strip()
    check_address(address)
    try:
        start_ray(address)
    except ResourceError as error:
        raise ResourceError(f"no cluster to submit to: {error}") from None


def scheduler() -> Any:
    """The running scheduler's actor handle."""
    try:
        return ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    except ValueError:
        raise ResourceError(
            "the Ray cluster has no unipar scheduler running (no actor "
            f"{SCHEDULER_NAME!r} in namespace {NAMESPACE!r}); start it with `unipar up` "
            "(`unipar up --address HOST:PORT` on a cluster started otherwise)"
        ) from None


def call(ref: Any, timeout_s: float = 60.0) -> Any:
    """The result of a scheduler call; its own errors raised as they are."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, UniparError):
            raise error.cause from None
        raise


def up(
    address: str | None = None,
    *,
    state_dir: str | Path | None = None,
    policy: PolicyName | str = PolicyName.UNIPAR,
    interval_s: float = DEFAULT_INTERVAL_S,
    num_cpus: int | None = None,
    port: int = 6379,
) -> dict[str, Any]:
    """Start the scheduler (and, with no Ray here and no ``address``, a cluster on this
    machine with ``ray start --head``); a scheduler already up is left as it is."""
    state = Path(state_dir or DEFAULT_STATE_DIR).expanduser().resolve()
    policy = PolicyName(policy)
    checks.number("interval_s", interval_s, minimum=0.05)
    if not ray.is_initialized():
        if address is None:
            address = _start_head(port, num_cpus)
            state.mkdir(parents=True, exist_ok=True)
            (state / "cluster").write_text(address + "\n")
        connect(address)
    try:
        return call(scheduler().ping.remote())
    except ResourceError:
        pass
    actor = (
        ray.remote(Scheduler)
        .options(name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                 max_restarts=-1, max_concurrency=8, scheduling_strategy=head())
        .remote(str(state), policy.value, interval_s)
    )
    return call(actor.ping.remote())


def _start_head(port: int, num_cpus: int | None) -> str:
    """``ray start --head`` on this machine; its address."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return f"127.0.0.1:{port}"  # a cluster is there already: join it
    command = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
               "--include-dashboard=false", "--disable-usage-stats"]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise ResourceError(
            f"`{' '.join(command)}` failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}; pass --address of a "
            "running cluster, or another --port"
        )
    return f"127.0.0.1:{port}"


def down() -> None:
    """Stop every queued and running job and the scheduler; the Ray cluster stays up
    (``ray stop`` on its machines ends it). The store keeps the history."""
    actor = scheduler()
    call(actor.shutdown.remote())
    ray.kill(actor, no_restart=True)


# -- jobs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobHandle:
    """A submitted job."""

    id: int

    def status(self) -> JobRow:
        return next(r for r in jobs() if r.id == self.id)

    def wait(self, timeout_s: float = 3600.0, poll_s: float = 0.5) -> JobRow:
        """The job's row once it has ended (``TimeoutError`` after ``timeout_s``)."""
        until = time.monotonic() + timeout_s
        while not (row := self.status()).state.ended:
            if time.monotonic() > until:
                raise TimeoutError(f"job {self.id} still {row.state.value} after {timeout_s} s")
            time.sleep(poll_s)
        return row

    def logs(self) -> str:
        return logs(self.id)

    def cancel(self) -> JobRow:
        return cancel(self.id)


def submit(
    job: Job,
    *,
    workers: int | tuple[int, int] = (1, 8),
    priority: int = 0,
    deadline: str | float | None = None,
    user: str | None = None,
    throughput: Mapping[str, float] | None = None,
    address: str | None = None,
    state_dir: str | Path | None = None,
    **fit_options: Any,
) -> JobHandle:
    """Queue ``job`` on the shared cluster; the scheduler sizes it within ``workers``.

    ``throughput``: on a cluster of several node types (:mod:`unipar.service.node_types`),
    the job's samples per second on one worker of each type, such as ``{"a": 100.0,
    "b": 200.0}`` (type ``b`` twice as fast for it): the scheduler places it by them until
    it has measured its own speed there."""
    # the shared cluster's commands (jobs, logs, cancel) run without torch, which a Job needs
    from unipar.job import Job  # noqa: PLC0415 (heavy: torch)

    if not isinstance(job, Job):
        raise ConfigError(f"submit takes a unipar.Job, but got {type(job).__name__}")
    least, most = check_workers(workers)
    sizes = worker_sizes(least, most, job.global_batch_size)
    checks.integer("priority", priority)
    when = parse_deadline(deadline)
    _preflight(job, least, most, fit_options)
    connect(address, Path(state_dir) if state_dir else None)
    actor = scheduler()
    types = typed_cluster(ray.nodes())
    declared = check_throughput(job.name, throughput, types.type_names if types else ())
    slots = cluster_slots()
    if sizes[0] > slots:
        raise ResourceError(
            f"the job needs at least {sizes[0]} workers, but the cluster holds {slots}; "
            f"pass --workers 1:{most}, or add nodes"
        )
    row = JobRow(
        id=0, name=job.name, user=user or getpass.getuser(), priority=priority, deadline=when,
        least=least, most=most, sizes=sizes, batch=job.global_batch_size, steps=job.steps,
        state=JobState.QUEUED, submitted=time.time(), throughput=declared,
        **adaptive_bounds(job),
    )
    blob = ray.cloudpickle.dumps((ray.cloudpickle.dumps(job), fit_options))
    return JobHandle(call(actor.submit.remote(row, blob)))


def _preflight(job: Job, least: int, most: int, fit_options: dict[str, Any]) -> None:
    """What the job's ``fit`` on the cluster would refuse, refused before it is queued:
    only the run settings marked for submitted jobs pass (the scheduler sets the others)."""
    from unipar.runtime.preflight import preflight  # noqa: PLC0415 (heavy: torch)

    allowed = submit_fields()
    unknown = sorted(set(fit_options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"submit passes only {', '.join(allowed)} on to fit, but got {unknown}; the "
            "scheduler sets the workers, the run directory and the size"
        )
    preflight(job, RunConfig(workers=(least, most), **fit_options))


def adaptive_bounds(job: Job) -> dict[str, int]:
    """An adaptive job's largest global batch and micro-batch per worker, as its store
    row holds them (none for a fixed batch)."""
    adaptive = job.adaptive
    if adaptive is None:
        return {}
    return {"max_batch": adaptive.max_global_batch,
            "max_local": adaptive.max_local_batch or adaptive.max_global_batch}


def jobs() -> list[JobRow]:
    return call(scheduler().jobs.remote())


def logs(job_id: int) -> str:
    return call(scheduler().logs.remote(job_id))


def cancel(job_id: int) -> JobRow:
    return call(scheduler().cancel.remote(job_id))


def _batch(row: JobRow) -> str:
    """The global batch it runs, and its M0 where an adaptive batch moved from it."""
    now = row.running_batch or row.batch
    return str(now) if now == row.batch else f"{now} (M0 {row.batch})"


def _where(row: JobRow) -> str:
    """On a cluster of several node types: the type its workers hold, and the one they
    move to (`` on b``, `` on b->a``)."""
    if not row.gpu_type:
        return ""
    if row.held_type in ("", row.gpu_type):
        return f" on {row.gpu_type}"
    return f" on {row.held_type}->{row.gpu_type}"


def format_jobs(rows: list[JobRow]) -> str:
    """The ``unipar jobs`` table."""
    header = ("JOB", "NAME", "USER", "STATE", "WORKERS", "BATCH", "GOODPUT", "PROGRESS", "ETA")
    lines = [header]
    for r in rows:
        eta = r.eta_s
        lines.append((
            str(r.id), r.name, r.user, r.state.value,
            f"{r.workers}/{r.target}{_where(r)}" if r.state is JobState.RUNNING else "-",
            _batch(r), f"{r.goodput:.1f}/s" if r.steps_per_s else "-",
            f"{r.step}/{r.steps} ({100 * r.step / max(r.steps, 1):.0f}%)",
            "-" if eta is None else f"{eta:.0f}s",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)
