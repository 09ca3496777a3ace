"""Workloads resampled from given ones, for held-out evaluation (pure).

A policy tuned on the Pollux paper's 8 workloads is judged on workloads it was never
run on: the same kind of jobs (each row's application, GPUs and batch drawn from the
pooled rows of the sources) arriving as in the sources (submission seconds drawn from
their pooled submission times, so the daily rhythm of arrivals is kept), from a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.workload import JobSpec


def resample_workload(sources: Sequence[Sequence[JobSpec]], seed: int,
                      jobs: int | None = None) -> list[JobSpec]:
    """``jobs`` jobs (default: as many as the first source) drawn from ``sources`` with
    ``seed``; named ``<application>-<i>`` in submission order."""
    rows = [job for source in sources for job in source]
    if not rows:
        raise ConfigError("resample_workload needs at least one job in its sources")
    count = len(sources[0]) if jobs is None else jobs
    if count < 1:
        raise ConfigError(f"jobs must be at least 1, but got {count}")
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, len(rows), size=count)
    times = np.sort(rng.choice(np.array([j.submit_time for j in rows]), size=count))
    out = []
    for i, (k, t) in enumerate(zip(kinds, times, strict=True)):
        row = rows[int(k)]
        out.append(JobSpec(name=f"{row.application}-{i}", submit_time=float(t),
                           application=row.application, num_replicas=row.num_replicas,
                           batch_size=row.batch_size))
    return out
