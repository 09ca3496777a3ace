"""A policy's jobs as the arrays the goodput search takes (:mod:`unipar.goodput.table`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unipar.goodput.table import JobArrays
from unipar.goodput.throughput import ThroughputModel
from unipar.sched.policy import JobView

_PRIOR = np.array([0.0, 1e-3, 0.0, 0.0, 0.0, 0.0, 1.0])  # before any report: speedups 1


def job_arrays(jobs: Sequence[JobView], models: Sequence[ThroughputModel | None]) -> JobArrays:
    """Arrays of what jobs reported; a job with no model yet runs its requested batch."""

    def col(f, dtype=float):
        return np.array([f(j) for j in jobs], dtype=dtype)

    return JobArrays(
        params=np.array([m.as_array() if m else _PRIOR for m in models]),
        grad_sqr=col(lambda j: j.grad_sqr),
        grad_var=col(lambda j: j.grad_var),
        init_batch=col(lambda j: j.init_batch),
        max_batch=col(lambda j: j.max_batch),
        min_local=col(lambda j: j.min_local),
        max_local=col(lambda j: j.max_local),
        fixed_batch=col(lambda j: j.requested_batch),
        adaptive=np.array([m is not None for m in models], dtype=bool),
    )
