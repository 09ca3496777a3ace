"""Results of a simulated run: per job, and the summary figures."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from unipar.sched.workload import JobSpec


@dataclass(frozen=True)
class JobResult:
    name: str
    application: str
    submit_time: float
    start_time: float
    finish_time: float
    restarts: int
    preemptions: int
    gpu_seconds: float
    deadline: float | None = None  # seconds after submission

    @property
    def jct(self) -> float:
        return self.finish_time - self.submit_time

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline is None else self.jct <= self.deadline


class FinishedJob(Protocol):
    """What a simulator keeps of a job it ran to the end."""

    spec: JobSpec
    start: float | None
    finish: float | None
    restarts: int
    preemptions: int
    attained: float  # GPU-seconds held


def job_results(done: Iterable[FinishedJob]) -> tuple[JobResult, ...]:
    """One result per finished job, in the order they were submitted (a job never
    started is counted from its submission)."""
    return tuple(
        JobResult(
            name=j.spec.name,
            application=j.spec.application,
            submit_time=j.spec.submit_time,
            start_time=j.start if j.start is not None else j.spec.submit_time,
            finish_time=float(j.finish),  # type: ignore[arg-type]  # a finished job has one
            restarts=j.restarts,
            preemptions=j.preemptions,
            gpu_seconds=j.attained,
            deadline=j.spec.deadline,
        )
        for j in sorted(done, key=lambda j: j.spec.submit_time)
    )


@dataclass(frozen=True)
class SimResult:
    policy: str
    jobs: tuple[JobResult, ...]
    gpu_seconds: float
    timeline: tuple[tuple[float, dict[str, int]], ...]
    cost: float
    node_seconds: float
    gpus_per_node: int

    @property
    def jcts(self) -> np.ndarray:
        return np.array([j.jct for j in self.jobs])

    @property
    def avg_jct(self) -> float:
        return float(self.jcts.mean())

    @property
    def p99_jct(self) -> float:
        return float(np.percentile(self.jcts, 99))

    @property
    def makespan(self) -> float:
        return max(j.finish_time for j in self.jobs) - min(j.submit_time for j in self.jobs)

    @property
    def utilisation(self) -> float:
        """GPU-seconds held by jobs over GPU-seconds the fleet had."""
        return self.gpu_seconds / max(self.node_seconds * self.gpus_per_node, 1e-9)

    def summary(self) -> dict:
        out = {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "avg_jct_s": round(self.avg_jct, 1),
            "p99_jct_s": round(self.p99_jct, 1),
            "makespan_s": round(self.makespan, 1),
            "gpu_utilisation": round(self.utilisation, 4),
            "cost": round(self.cost, 2),
            "restarts": sum(j.restarts for j in self.jobs),
            "preemptions": sum(j.preemptions for j in self.jobs),
        }
        deadlines = [j.met_deadline for j in self.jobs if j.deadline is not None]
        if deadlines:
            out["deadlines_met"] = f"{sum(deadlines)}/{len(deadlines)}"
        return out

    def write_json(self, path: Path) -> None:
        data = {
            "summary": self.summary(),
            "jobs": [asdict(j) | {"jct": j.jct} for j in self.jobs],
        }
        Path(path).write_text(json.dumps(data, indent=1))
