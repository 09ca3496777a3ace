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

It also carries a global batch set from outside (the shared cluster's scheduler, for an
adaptive job), applied by every rank before the same step by the same agreement: the
controller sets ``batch`` (a request count and the batch); rank 0, seeing a new request
before step ``k``, writes ``batch_at/<i>`` = (``k + 1``, batch) for its ``i``-th one and
still runs step ``k`` at the old batch; every rank reads the keys ``batch_at/0, 1, ...``
in turn before each step and applies each from its step on. The keys are numbered, never
overwritten, so a rank never misses one that a later request followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import torch.distributed as dist

from unipar.runtime.elastic.gloo_links import GlooLinks, socket_inodes
from unipar.runtime.parallel.mesh_caches import forget_meshes

_STOP = "unipar/stop"
_STOP_AT = "unipar/stop_at"
_BATCH = "unipar/batch"
_BATCH_AT = "unipar/batch_at/"
_FIRST_FAILURE = "unipar/first_failure"


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
        self._batches = 0  # batch requests sent to this formation's store

    def new(self, world_size: int, timeout_s: float) -> Rendezvous:
        self.close()
        self.generation += 1
        self._batches = 0
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

    def request_batch(self, batch: int) -> None:
        """Ask the gang to run global ``batch`` from the next step boundary they can
        agree on (see the module's docstring)."""
        if self._store is not None:
            self._batches += 1
            self._store.set(_BATCH, f"{self._batches}:{batch}")
            self._store.check([_BATCH])

    def close(self) -> None:
        self._store = None  # the server closes with its last reference


class StopSignal:
    """A rank's side of the stop protocol (see module doc)."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self._stop_at: int | None = None
        self._batch_taken = 0  # rank 0: the last batch request it gave a step
        self._batch_keys = 0  # the next ``batch_at`` key to read
        self._batches: list[tuple[int, int]] = []  # (first step, batch) not yet applied

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

    def first_to_fail(self) -> bool:
        """Called by a rank whose step failed: whether it is the first of its gang to say
        so (the store's compare-and-set is atomic). A rank that fails because a peer cut
        its connections after failing itself always comes second: the first failure is
        the cause, the later ones its echoes."""
        try:
            first = self.store.compare_set(_FIRST_FAILURE, "", str(self.rank))
        except RuntimeError:  # the store is gone (a DistError): no peer can claim it
            return True
        return first == str(self.rank).encode()

    def batch_before(self, step: int) -> int | None:
        """The global batch this rank runs from ``step`` on, when one set from outside
        takes effect there (None: the batch stays as it is)."""
        if self.rank == 0 and self.store.check([_BATCH]):
            count, batch = (int(x) for x in self.store.get(_BATCH).decode().split(":"))
            if count > self._batch_taken:
                self._batch_taken = count
                at = step + (self.world_size > 1)  # alone: at once; else after one step
                key = f"{_BATCH_AT}{self._batch_keys}"
                self.store.set(key, f"{at}:{batch}")
                self.store.check([key])  # held by the server before the step's collective
        while self.store.check([f"{_BATCH_AT}{self._batch_keys}"]):
            at, batch = (int(x) for x in
                         self.store.get(f"{_BATCH_AT}{self._batch_keys}").decode().split(":"))
            self._batches.append((at, batch))
            self._batch_keys += 1
        due = [batch for at, batch in self._batches if at <= step]
        self._batches = [(at, batch) for at, batch in self._batches if at > step]
        return due[-1] if due else None


def join(
    rendezvous: Rendezvous, rank: int, *, backend: str, timeout_s: float, links: GlooLinks
) -> StopSignal:
    """Join the formation's process group (every rank, also a single one: the store
    carries the stop signal); a gloo group's connections are recorded in ``links``.
    Returns this rank's stop signal."""
    store = dist.TCPStore(
        rendezvous.address,
        rendezvous.port,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        use_libuv=True,
    )
    if rendezvous.world_size > 1:
        before = socket_inodes()
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(f"pg{rendezvous.generation}/", store),
            rank=rank,
            world_size=rendezvous.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        if backend == "gloo":
            links.record(store, rank, rendezvous.world_size, before)
    return StopSignal(store, rank, rendezvous.world_size)


def leave() -> None:
    """Destroy this rank's process group, if any (also after a peer died), and forget
    DTensor's answers about its meshes (:mod:`unipar.runtime.parallel.mesh_caches`)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    forget_meshes()
