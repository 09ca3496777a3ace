"""Rendezvous for each formation of an elastic gang, and the stop signal it carries.

The controller hosts a fresh ``TCPStore`` on a new port for every formation, so no
key of an earlier gang (a dead rank's, a half-finished barrier's) can be read by the
next one. The same store carries the controller's request to stop at a step
boundary (to grow, or to let a draining node's workers leave), agreed as follows:

- the controller sets ``stop``;
- rank 0 checks ``stop`` before each step ``k``; once it is set, rank 0 writes
  ``stop_at = k + 1`` and still runs step ``k``;
- every other rank checks ``stop_at`` before each step. A rank can only have finished
  step ``k`` once rank 0 took part in it (every step of every plan has a collective
  that rank 0 joins, directly or through its stage's peers), i.e. after rank 0 wrote
  ``stop_at``: so every rank stops before the same step ``k + 1`` and none is left
  waiting in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import torch.distributed as dist

_STOP = "unipar/stop"
_STOP_AT = "unipar/stop_at"


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one formation meet."""

    address: str
    port: int
    world_size: int
    generation: int


def _driver_address() -> str:
    return ray.util.get_node_ip_address()


class RendezvousHost:
    """The controller's side: one store per formation, and the stop request."""

    def __init__(self) -> None:
        self.generation = 0
        self._store: Any = None

    def new(self, world_size: int, timeout_s: float) -> Rendezvous:
        self.close()
        self.generation += 1
        address = _driver_address()
        self._store = dist.TCPStore(
            address,
            0,  # a fresh port
            world_size=None,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            use_libuv=True,
        )
        return Rendezvous(address, int(self._store.port), world_size, self.generation)

    def request_stop(self) -> None:
        """Ask the gang to stop at the next step boundary they can agree on."""
        if self._store is not None:
            self._store.set(_STOP, "1")
            # A store's set is sent without a reply: a check on this connection returns
            # once the server holds the key, so every rank that looks after this sees it.
            self._store.check([_STOP])

    def close(self) -> None:
        self._store = None  # the server closes with its last reference


class StopSignal:
    """A rank's side of the stop protocol (see module doc)."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self._stop_at: int | None = None

    def stop_before(self, step: int) -> bool:
        """Whether this rank must stop before running ``step``."""
        if self._stop_at is None:
            if self.rank == 0:
                if self.store.check([_STOP]):
                    # Alone, rank 0 can stop at once; with peers, after one more step.
                    self._stop_at = step + (self.world_size > 1)
                    self.store.set(_STOP_AT, str(self._stop_at))
                    # set is sent without a reply: a check on this connection returns once
                    # the server holds the key, before this rank's next collective lets a
                    # peer finish step k and look for it
                    self.store.check([_STOP_AT])
            elif self.store.check([_STOP_AT]):
                self._stop_at = int(self.store.get(_STOP_AT))
        return self._stop_at is not None and step >= self._stop_at


def join(rendezvous: Rendezvous, rank: int, *, backend: str, timeout_s: float) -> StopSignal:
    """Join the formation's process group (every rank, also a single one: the store
    carries the stop signal). Returns this rank's stop signal."""
    store = dist.TCPStore(
        rendezvous.address,
        rendezvous.port,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        use_libuv=True,
    )
    if rendezvous.world_size > 1:
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(f"pg{rendezvous.generation}/", store),
            rank=rank,
            world_size=rendezvous.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    return StopSignal(store, rank, rendezvous.world_size)


def leave() -> None:
    """Destroy this rank's process group, if any (also after a peer died)."""
    if dist.is_initialized():
        dist.destroy_process_group()
