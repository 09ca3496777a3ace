"""The scheduler's state on the head node: jobs, their history and allocations, in SQLite.

Every change is committed at once, so a scheduler that is killed and started again reads
back every job (queued, running, ended), its decisions and the events of its history.
"""

from __future__ import annotations

import enum
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobRow:
    """One job as the store holds it (the job itself is kept apart, pickled)."""

    id: int
    name: str
    user: str
    priority: int
    deadline: float | None  # unix seconds
    least: int
    most: int
    sizes: tuple[int, ...]  # worker counts its plan can take, least..most
    batch: int  # its global batch M0 (an adaptive job's first)
    steps: int
    state: JobState
    submitted: float
    started: float | None = None
    ended: float | None = None
    target: int = 0  # workers the scheduler gives it
    workers: int = 0  # workers it runs on, as it last reported
    step: int = 0  # steps of batch M0 done (an adaptive job's progress)
    steps_per_s: float = 0.0  # steps of M0's progress per second at its current size
    worker_seconds: float = 0.0  # workers x seconds held so far
    max_seen: int = 0  # most workers it ran on
    restarts: int = 0  # resizes so far
    # size -> (steps of M0's progress, seconds) (:mod:`unipar.service.ledger`)
    step_times: dict[int, tuple[float, float]] | None = None
    runner: str = ""  # the name of its runner actor
    run_dir: str = ""
    error: str = ""
    running_batch: int = 0  # the global batch it last ran (0: none reported yet)
    # on a cluster of several node types (:mod:`unipar.service.node_types`): the job's
    # declared samples per second on one worker of each type, the type the scheduler
    # gives it, the one its workers hold, and its step_times per type they held
    throughput: dict[str, float] | None = None
    gpu_type: str = ""
    held_type: str = ""  # the type its workers were last seen holding (Ray's assignment)
    typed_step_times: dict[str, dict[int, tuple[float, float]]] | None = None
    # an adaptive job (``Job.adaptive``): its largest global batch (0: a fixed batch) and
    # micro-batch per worker, the gradient statistics it last reported (|G|², tr(Σ) per
    # sample), its steps per shape run (:class:`~unipar.service.ledger.RunnerStatus`), and
    # the global batch the scheduler set it with its size (0: none, its own choice)
    max_batch: int = 0
    max_local: int = 0
    grad_sqr: float = 0.0
    grad_var: float = 0.0
    batch_times: dict[tuple[int, int, int], tuple[float, float]] | None = None
    decided_batch: int = 0

    @property
    def goodput(self) -> float:
        """Samples of batch M0's progress per second: throughput × statistical efficiency
        (Pollux eq. 1) for an adaptive job; all samples count for a fixed batch."""
        return self.steps_per_s * self.batch

    @property
    def eta_s(self) -> float | None:
        if self.state.ended or self.steps_per_s <= 0:
            return None
        return (self.steps - self.step) / self.steps_per_s


_COLUMNS = [f.name for f in fields(JobRow)]
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs ({", ".join(
    ("id INTEGER PRIMARY KEY AUTOINCREMENT" if c == "id" else c) for c in _COLUMNS
)}, job BLOB);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER,
    time REAL, text TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def _encode_times(value: dict[int, tuple[float, float]]) -> dict[str, list[float]]:
    return {str(k): list(v) for k, v in value.items()}


def _decode_times(value: dict[str, list[float]]) -> dict[int, tuple[float, float]]:
    return {int(k): (float(v[0]), float(v[1])) for k, v in value.items()}


def _encode_shapes(value: dict[tuple[int, ...], tuple[float, float]]) -> dict[str, list[float]]:
    return {",".join(map(str, k)): list(v) for k, v in value.items()}


def _decode_shapes(value: dict[str, list[float]]) -> dict[tuple[int, ...], tuple[float, float]]:
    return {tuple(int(x) for x in k.split(",")): (float(v[0]), float(v[1]))
            for k, v in value.items()}


def _encode(name: str, value: Any) -> Any:
    if isinstance(value, JobState):
        return value.value
    if name == "sizes":
        return json.dumps(list(value))
    if name == "step_times":
        return json.dumps(_encode_times(value)) if value else None
    if name == "typed_step_times":
        return json.dumps({t: _encode_times(v) for t, v in value.items()}) if value else None
    if name == "throughput":
        return json.dumps(value) if value else None
    if name == "batch_times":
        return json.dumps(_encode_shapes(value)) if value else None
    return value


def _decode(name: str, value: Any) -> Any:
    if name == "state":
        return JobState(value)
    if name == "sizes":
        return tuple(json.loads(value))
    loaded = json.loads(value) if value and name in _JSON else None
    if name == "step_times":
        return _decode_times(loaded) if loaded else None
    if name == "typed_step_times":
        return {t: _decode_times(v) for t, v in loaded.items()} if loaded else None
    if name == "throughput":
        return {t: float(v) for t, v in loaded.items()} if loaded else None
    if name == "batch_times":
        return _decode_shapes(loaded) if loaded else None
    return value


_JSON = ("step_times", "typed_step_times", "throughput", "batch_times")


class Store:
    """Jobs and events in one SQLite file; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Columns a store written by an older unipar lacks are added, holding the field's
        default (a field without one cannot be missing: it was in the first schema)."""
        have = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)").fetchall()}
        for f in fields(JobRow):
            if f.name in have:
                continue
            if f.default is MISSING:
                raise RuntimeError(f"the job store {self.path} lacks the column {f.name!r}, "
                                   "which has no default; it was not written by unipar")
            self._db.execute(f"ALTER TABLE jobs ADD COLUMN {f.name}")
            self._db.execute(f"UPDATE jobs SET {f.name} = ?", (_encode(f.name, f.default),))

    def token(self) -> str:
        """A random name for this store, made once: runner actors are named with it."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='token'").fetchone()
            if row:
                return str(row[0])
            token = secrets.token_hex(4)
            self._db.execute("INSERT INTO meta VALUES ('token', ?)", (token,))
            return token

    def add(self, row: JobRow, job: bytes) -> int:
        values = {c: _encode(c, getattr(row, c)) for c in _COLUMNS if c != "id"}
        names = ", ".join(values)
        with self._lock:
            cursor = self._db.execute(
                f"INSERT INTO jobs ({names}, job) VALUES ({', '.join('?' * (len(values) + 1))})",
                (*values.values(), job),
            )
            return int(cursor.lastrowid or 0)

    def update(self, job_id: int, **changes: Any) -> None:
        sets = ", ".join(f"{name} = ?" for name in changes)
        values = [_encode(name, value) for name, value in changes.items()]
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*values, job_id))

    def rows(self, *states: JobState) -> list[JobRow]:
        where = f" WHERE state IN ({', '.join('?' * len(states))})" if states else ""
        with self._lock:
            found = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM jobs{where} ORDER BY id",
                [s.value for s in states],
            ).fetchall()
        return [JobRow(**{c: _decode(c, v) for c, v in zip(_COLUMNS, r, strict=True)})
                for r in found]

    def row(self, job_id: int) -> JobRow | None:
        return next((r for r in self.rows() if r.id == job_id), None)

    def job(self, job_id: int) -> bytes:
        with self._lock:
            return bytes(self._db.execute("SELECT job FROM jobs WHERE id = ?",
                                          (job_id,)).fetchone()[0])

    def event(self, job_id: int, text: str, when: float | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO events (job, time, text) VALUES (?, ?, ?)",
                (job_id, time.time() if when is None else when, text),
            )

    def events(self, job_id: int) -> list[tuple[float, str]]:
        with self._lock:
            return [(float(t), str(x)) for t, x in self._db.execute(
                "SELECT time, text FROM events WHERE job = ? ORDER BY id", (job_id,)
            ).fetchall()]

    def close(self) -> None:
        with self._lock:
            self._db.close()
