"""What unipar's policy may know of a job's length, for experiments (pure).

unipar's policy weighs each job by its predicted remaining time, from
``JobView.remaining_progress``: the job's declared length less its progress. A live job
declares its steps (``Job.steps``) and ends exactly there, and so does a simulated one
(its epochs), so in the simulator the declared length is the exact work left. Two views
with less knowledge:

- :func:`misdeclared`: every job's declared length is off by a factor drawn, per job and
  ``seed``, log-uniformly from ``[1 / spread, spread]`` (users' estimates are rough; the
  policy never learns the truth);
- :func:`unipar_policy_without_lengths`: no lengths at all (no weighting by remaining time,
  no restart weighed against the time it saves): what Pollux knows.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

from unipar.errors import ConfigError
from unipar.sched.policies.goodput import GoodputPolicy, unipar_policy
from unipar.sched.policy import Allocation, Policy, RoundState


def declared_factor(name: str, seed: int, spread: float) -> float:
    """The factor job ``name``'s declared length is off by: log-uniform in
    ``[1 / spread, spread]``, a function of ``(name, seed)`` alone."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    return math.exp((2 * u - 1) * math.log(spread))


@dataclass
class MisdeclaredLengths(Policy):
    """``inner`` seeing each job's declared length scaled by :func:`declared_factor`
    (what is left of it: at least nothing)."""

    inner: Policy
    seed: int
    spread: float = 2.0

    def __post_init__(self) -> None:
        if not self.spread >= 1:
            raise ConfigError(f"spread must be >= 1 (a factor and its inverse), but got "
                              f"{self.spread}")
        self.name = f"{self.inner.name}-misdeclared-{self.seed}"
        self.adaptive_batch = self.inner.adaptive_batch

    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        jobs = []
        for job in state.jobs:
            declared = (job.progress + job.remaining_progress) * declared_factor(
                job.name, self.seed, self.spread)
            jobs.append(replace(job, remaining_progress=max(0.0, declared - job.progress)))
        return self.inner.allocate(replace(state, jobs=jobs))


def misdeclared(seed: int, spread: float = 2.0) -> Policy:
    """unipar's policy with every job's length misdeclared (see the module doc)."""
    return MisdeclaredLengths(unipar_policy(), seed, spread)


def unipar_policy_without_lengths() -> GoodputPolicy:
    """unipar's policy knowing nothing of job lengths: the same goodput model, exponent,
    pooled models and fair-share base, without the remaining-time weight and the restart
    weighed against the time it saves (both need a length)."""
    return replace(unipar_policy(), name="unipar-no-lengths", remaining_power=0.0,
                   restart_by_remaining=False)
