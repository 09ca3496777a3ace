"""What code running inside a training actor (xgboost callbacks, ``DistributedCallback``
hooks) can ask: XGBoost-Ray's ``session`` functions.

- ``get_actor_rank()``: this actor's index (its data shard), 0..num_actors-1;
- ``get_rabit_rank()``: its rank in xgboost's collective (during training);
- ``put_queue(item)``: send ``item`` to the driver. The driver calls callables there
  (with no arguments) and appends anything else to
  ``additional_results["callback_returns"][actor_rank]``.
"""

from __future__ import annotations

import threading
from typing import Any

from unipar.errors import ConfigError


class RayXGBoostSession:
    """One per actor process: its rank and the items waiting for the driver."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def get_actor_rank(self) -> int:
        return self._rank

    def put_queue(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def drain(self) -> list[tuple[int, Any]]:
        """The items put so far, as ``(actor_rank, item)``, in order; empties the queue."""
        with self._lock:
            items, self._items = self._items, []
        return [(self._rank, item) for item in items]


_session: RayXGBoostSession | None = None


def init_session(rank: int) -> RayXGBoostSession:
    """Called once by the actor when it starts."""
    global _session
    _session = RayXGBoostSession(rank)
    return _session


def is_xgboost_ray_actor() -> bool:
    return _session is not None


def get_session() -> RayXGBoostSession:
    if _session is None:
        raise ConfigError(
            "the xgboost session exists only inside a training actor: call get_actor_rank(), "
            "get_rabit_rank() and put_queue() from callbacks that train() runs on its actors"
        )
    return _session


def get_actor_rank() -> int:
    return get_session().get_actor_rank()


def get_rabit_rank() -> int:
    from xgboost import collective  # noqa: PLC0415 (heavy: xgboost)

    get_session()
    return collective.get_rank()


def put_queue(item: Any) -> None:
    get_session().put_queue(item)
