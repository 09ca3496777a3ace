"""Workload files: one job per row, ``name,time,application,num_replicas,batch_size``.

The format of the Pollux artifact's workloads (submission second, application, and the GPUs
and total batch a user would ask for; fixed-size baselines run jobs at exactly these).
Optional columns: ``user`` (for GPU quotas) and ``deadline`` (seconds after submission).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from unipar.errors import ConfigError
from unipar.sched.traces import Application

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True)
class JobSpec:
    """A submitted job, as the user asked for it."""

    name: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int
    user: str = ""
    deadline: float | None = None  # seconds after submission
    line: int = 0  # where it came from, for error messages


def _number(path: Path, line: int, column: str, text: str, kind: type) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{path}:{line}: column {column!r} must be a {kind.__name__}, but got {text!r}; "
            "fix the row"
        ) from None
    if value < 0 or (kind is int and column != "time" and value < 1):
        raise ConfigError(f"{path}:{line}: column {column!r} must be positive, but got {text!r}")
    return value


def read_workload(
    path: Path, applications: dict[str, Application], max_gpus: int | None = None
) -> list[JobSpec]:
    """Parse and check a workload; errors name the file and line of the bad row.

    ``max_gpus``: the most GPUs the cluster can ever give one job; a row asking for more
    can never run and is refused.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"workload file {path} does not exist")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"{path}:1: header must name the columns {', '.join(COLUMNS)}, "
                f"but {', '.join(missing)} missing (got {reader.fieldnames})"
            )
        jobs = []
        names = set()
        for row in reader:
            line = reader.line_num
            if None in row or any(row[c] in (None, "") for c in COLUMNS):
                raise ConfigError(
                    f"{path}:{line}: a row needs exactly the {len(reader.fieldnames)} columns "
                    f"{', '.join(reader.fieldnames)}, but got {row}"
                )
            app = row["application"]
            if app not in applications:
                raise ConfigError(
                    f"{path}:{line}: unknown application {app!r}; known: "
                    f"{', '.join(sorted(applications))}"
                )
            replicas = int(_number(path, line, "num_replicas", row["num_replicas"], int))
            batch = int(_number(path, line, "batch_size", row["batch_size"], int))
            if max_gpus is not None and replicas > max_gpus:
                raise ConfigError(
                    f"{path}:{line}: job {row['name']!r} asks for {replicas} GPUs but the "
                    f"cluster can give a job at most {max_gpus}; it could never run: lower "
                    "num_replicas or add nodes"
                )
            limit = applications[app].max_local_bsz * replicas * 64
            if batch > limit:
                raise ConfigError(
                    f"{path}:{line}: batch_size {batch} on {replicas} GPUs needs more than 64 "
                    f"accumulation steps of {app}'s largest per-GPU batch "
                    f"{applications[app].max_local_bsz}; it can never fit"
                )
            if row["name"] in names:
                raise ConfigError(f"{path}:{line}: job name {row['name']!r} appears twice")
            names.add(row["name"])
            deadline = row.get("deadline") or None
            jobs.append(
                JobSpec(
                    name=row["name"],
                    submit_time=_number(path, line, "time", row["time"], float),
                    application=app,
                    num_replicas=replicas,
                    batch_size=batch,
                    user=row.get("user") or "",
                    deadline=None
                    if deadline is None
                    else _number(path, line, "deadline", deadline, float),
                    line=line,
                )
            )
    if not jobs:
        raise ConfigError(f"{path}: the workload has no jobs")
    return sorted(jobs, key=lambda j: j.submit_time)
