"""How the controller recovers from a lost worker: its one choice between two policies.

Both run on the same controller, supervisor, formations and worker actors
(:mod:`unipar.runtime.elastic.controller`); they differ in where the next gang's state
comes from, and in whether the gang follows the cluster.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unipar.runtime.config import RunConfig


class Recovery(Enum):
    # The survivors go on from the state in memory (a surviving replica's, or the newest
    # in-memory snapshot of sharded state; the disk only when neither holds it), within
    # the job's range of sizes; the gang also follows the cluster: it grows into free
    # room, lets a draining node's workers leave and keeps to an outside size target.
    LIVE = "live"
    # The whole gang goes back to the newest disk checkpoint (else to where the run
    # began), topped up to its fixed size with new workers; nothing is taken from
    # memory, no snapshot is taken, the cluster is not watched (``elastic=False``).
    RESTART_FROM_CHECKPOINT = "restart from checkpoint"

    @classmethod
    def of(cls, config: RunConfig) -> Recovery:
        """The policy a :class:`~unipar.runtime.config.RunConfig` asks for (its ``elastic``)."""
        return cls.LIVE if config.elastic else cls.RESTART_FROM_CHECKPOINT

    @property
    def keeps_state_in_memory(self) -> bool:
        """Whether a lost worker's gang takes its state from memory (snapshots, replicas)."""
        return self is Recovery.LIVE

    @property
    def follows_cluster(self) -> bool:
        """Whether the gang grows into free room, leaves draining nodes and keeps to a
        size target while it trains."""
        return self is Recovery.LIVE
