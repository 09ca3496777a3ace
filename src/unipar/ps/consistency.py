"""Consistency models of a parameter server. Pure.

- BSP (bulk synchronous): a worker computing clock ``c`` reads parameters with every
  update of clocks ``< c`` applied.
- SSP with bound ``s`` (Ho et al., "More Effective Distributed ML via a Stale
  Synchronous Parallel Parameter Server", NIPS 2013): it may read parameters missing
  the updates of the last ``s`` clocks; s=0 is BSP.
- ASP (asynchronous, as Hogwild!/Downpour): never waits; each push is applied on
  arrival, scaled by 1/workers.

Under BSP and SSP the server sums the pushes of one clock and applies them together
once every worker is past that clock, so SSP with s=0 is BSP step for step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unipar.errors import ConfigError


class Consistency(Enum):
    BSP = "bsp"
    SSP = "ssp"
    ASP = "asp"


@dataclass(frozen=True)
class ConsistencySpec:
    """A consistency model and, for SSP, its staleness bound (clocks)."""

    mode: Consistency = Consistency.BSP
    staleness: int = 0

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ConfigError(
                f"the staleness bound must be >= 0 (0 is BSP), but got staleness="
                f"{self.staleness}; pass staleness=0 for BSP or a positive bound for SSP"
            )
        if self.mode is Consistency.BSP and self.staleness:
            raise ConfigError(
                f"BSP has no staleness, but got staleness={self.staleness}; use "
                f"mode=SSP with staleness={self.staleness}, or staleness=0"
            )

    @property
    def aggregates(self) -> bool:
        """Whether pushes of one clock are summed and applied together (BSP, SSP)."""
        return self.mode is not Consistency.ASP

    def bound(self) -> int | None:
        """Clocks a reader may lag behind (None: unbounded)."""
        return None if self.mode is Consistency.ASP else self.staleness


def may_read(clock: int, applied: int, spec: ConsistencySpec) -> bool:
    """Whether a worker about to compute ``clock`` may read parameters in which every
    clock up to ``applied`` is applied: it needs ``applied >= clock - 1 - s``."""
    bound = spec.bound()
    return bound is None or applied >= clock - 1 - bound
