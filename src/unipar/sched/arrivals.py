"""The start of every simulated round, shared by the one-type and the typed simulators:
jobs whose submit time has come join the active ones, an idle cluster skips ahead to the
next arrival's round, and a run past its horizon fails naming a job it never finished."""

from __future__ import annotations

import math
from typing import Protocol, TypeVar

from unipar.errors import ConfigError


class _Spec(Protocol):
    name: str
    submit_time: float


class _Pending(Protocol):
    spec: _Spec


J = TypeVar("J", bound=_Pending)


def admit_arrivals(
    pending: list[J], active: list[J], now: float, interval: float, horizon: float, hint: str
) -> float | None:
    """Move the jobs submitted by ``now`` from ``pending`` (sorted by submit time) to
    ``active``. Returns ``None`` when the round at ``now`` has jobs to schedule, else the
    round of the next arrival to skip to. Raises past ``horizon``, ending with ``hint``."""
    while pending and pending[0].spec.submit_time <= now:
        active.append(pending.pop(0))
    if not active:
        return math.ceil(pending[0].spec.submit_time / interval) * interval
    if now > horizon:
        raise ConfigError(
            f"simulation passed its horizon of {horizon:.0f} s with {len(active)} jobs "
            f"unfinished (e.g. {active[0].spec.name!r}); the policy never ran them{hint}"
        )
    return None
