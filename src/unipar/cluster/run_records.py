"""What finished runs measured, kept per cluster for the planner to learn from.

Each run (and each size an elastic run trained at) leaves one :class:`RunRecord`: the
cluster's fingerprint, the plan, the steady-state step time measured and predicted,
and, per measured quantity (the step; from the traced steps the forward passes and the
optimizer where they can be told apart), its seconds as the cost model splits them
among the rate groups of :mod:`unipar.cluster.corrections`. The records live in the
same cache as the CPU calibration (``~/.cache/unipar``), one JSON-lines file per
cluster fingerprint. Pure (files and numbers): no Ray, no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from unipar.cluster.corrections import Rate, base_cluster
from unipar.cluster.spec import ClusterSpec

# A machine whose load average is above this many times its cores runs every worker
# slower than its calibration, by an amount that comes and goes with its neighbours:
# such runs are kept apart (listed, not learned from).
OVERLOAD = 2.0
KEEP_PER_CLUSTER = 50  # records kept per cluster, the newest
_FILE_PREFIX = "runs-"


def cache_dir() -> Path:
    """Where unipar keeps what it measured: ``~/.cache/unipar`` (the CPU calibration and
    the run records)."""
    return Path.home() / ".cache" / "unipar"


RECORDS_DIR_VARIABLE = "UNIPAR_RUN_RECORDS"


def records_dir() -> Path:
    """Where the run records go by default: ``$UNIPAR_RUN_RECORDS`` where it is set, else
    :func:`cache_dir`. The test suite sets it, so that its runs (its subprocesses and
    Ray workers included, which inherit the environment) never teach the planner of the
    machine they run on, nor learn from it."""
    override = os.environ.get(RECORDS_DIR_VARIABLE)
    return Path(override) if override else cache_dir()


class Measured(Enum):
    """What a record's observation measured: the whole step (every run), the forward
    passes (a traced run whose forward holds no communication) or the optimizer (a
    traced run whose optimizer steps plain tensors)."""

    STEP = "step"
    FORWARD = "forward"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class Observation:
    """One measured quantity against the uncorrected cost model: ``predicted_s`` split
    into each rate group's seconds (``seconds``: the derivative of the prediction by
    the group's time, which sums to the prediction)."""

    what: Measured
    measured_s: float
    predicted_s: float
    seconds: tuple[tuple[Rate, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what.value,
            "measured_s": self.measured_s,
            "predicted_s": self.predicted_s,
            "seconds": {rate.value: s for rate, s in self.seconds},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Observation:
        return cls(
            what=Measured(data["what"]),
            measured_s=float(data["measured_s"]),
            predicted_s=float(data["predicted_s"]),
            seconds=tuple((Rate(k), float(v)) for k, v in data["seconds"].items()),
        )


@dataclass(frozen=True)
class Fingerprint:
    """A cluster's identity for learning: ``key`` (a digest of the device, its count,
    the node layout, the link classes and, measured here, the machine and its
    calibrated numbers) and a ``label`` for people."""

    key: str
    label: str


# DeviceSpec fields added after runs were first recorded: left out of the fingerprint where
# they are zero (as every cluster had them before), so that the runs a cluster recorded
# before they existed still correct it; where set (an eager GPU's host time), the cluster
# is priced otherwise and its earlier runs, split without it, are another cluster's.
_ADDED_DEVICE_FIELDS = ("host_op_s",)


def fingerprint(cluster: ClusterSpec) -> Fingerprint:
    """The fingerprint of ``cluster`` as specified (learned corrections left out): the
    same preset at the same size, or the same calibrated machine with the same number
    of workers, is the same cluster; another size, device, link or calibration is
    another."""
    base = base_cluster(cluster)
    about = asdict(base)
    about.pop("corrections", None)
    for name in _ADDED_DEVICE_FIELDS:  # at their default, older records keep their key
        if not about["device"].get(name):
            about["device"].pop(name, None)
    text = json.dumps(about, sort_keys=True, default=_enum_value)
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    where = f" on {base.machine.split(':')[0]}" if base.machine else ""
    label = f"{base.name}: {base.nodes} x {base.devices_per_node} {base.device.name}{where}"
    return Fingerprint(key, label)


def _enum_value(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"not JSON: {value!r}")


@dataclass(frozen=True)
class RunRecord:
    """One run's (or one size's) measurement on one cluster. ``predicted_s``: the step
    time the run was told before it started (with the corrections of the time);
    ``measured_s``: the median steady-state step; ``load_average``: the machine's
    one-minute load average at the end, over ``cpus`` cores."""

    cluster: str
    cluster_label: str
    finished_at: float
    job: str
    plan: str
    workers: int
    steps: int
    predicted_s: float
    measured_s: float
    load_average: float
    cpus: int
    observations: tuple[Observation, ...]

    @property
    def overloaded(self) -> bool:
        """Whether the machine was visibly overloaded (load average above
        :data:`OVERLOAD` x its cores): kept apart from the fit."""
        return self.load_average > OVERLOAD * self.cpus

    @property
    def error(self) -> float:
        """The prediction's error: predicted over measured, minus one."""
        return self.predicted_s / self.measured_s - 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["observations"] = [o.to_dict() for o in self.observations]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        fields = {**data, "observations": tuple(map(Observation.from_dict, data["observations"]))}
        return cls(**fields)


def machine_load() -> tuple[float, int]:
    """(one-minute load average, cores) of this machine."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform: count as quiet
        load = 0.0
    return load, os.cpu_count() or 1


def records_file(directory: Path, key: str) -> Path:
    return directory / f"{_FILE_PREFIX}{key}.jsonl"


def read_records(path: Path) -> list[RunRecord]:
    """The records of one file, oldest first; unreadable lines are skipped (a record
    written by another version, or cut short)."""
    records = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                records.append(RunRecord.from_dict(json.loads(line)))
    return records


def records_for(cluster: ClusterSpec, directory: Path | None = None) -> list[RunRecord]:
    """The records of runs on ``cluster`` (its fingerprint), oldest first."""
    key = fingerprint(cluster).key
    found = read_records(records_file(directory or records_dir(), key))
    return [r for r in found if r.cluster == key]


def store_record(record: RunRecord, directory: Path | None = None) -> Path | None:
    """Append ``record`` to its cluster's file, keeping the newest
    :data:`KEEP_PER_CLUSTER`; returns the file (``None`` where it cannot be written: a
    read-only home only costs the learning)."""
    path = records_file(directory or records_dir(), record.cluster)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(json.dumps(record.to_dict()) + "\n")
        kept = read_records(path)
        if len(kept) > 2 * KEEP_PER_CLUSTER:
            lines = [json.dumps(r.to_dict()) for r in kept[-KEEP_PER_CLUSTER:]]
            path.write_text("\n".join(lines) + "\n")
    except OSError:
        return None
    return path


def all_records(directory: Path | None = None) -> dict[str, list[RunRecord]]:
    """Every cluster's records, by fingerprint key."""
    directory = directory or records_dir()
    found: dict[str, list[RunRecord]] = {}
    for path in sorted(directory.glob(f"{_FILE_PREFIX}*.jsonl")):
        records = read_records(path)
        if records:
            found[records[0].cluster] = records
    return found


def drop_records(directory: Path | None = None) -> int:
    """Remove every cluster's records; returns how many files went."""
    directory = directory or records_dir()
    dropped = 0
    for path in directory.glob(f"{_FILE_PREFIX}*.jsonl"):
        with contextlib.suppress(OSError):
            path.unlink()
            dropped += 1
    return dropped

