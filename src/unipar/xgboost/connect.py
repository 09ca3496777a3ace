"""Join Ray as XGBoost-Ray's ``train`` does (``ray.init()``): the cluster named by
``RAY_ADDRESS``, else one already running on this machine (``ray start --head``), else a
new local one (which stays up until the process exits, so ``train`` then ``predict``
start it once)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import ray

from unipar.ray_cluster.session import start_ray


def attach_or_start_ray(before_starting: Callable[[], None] | None = None) -> None:
    """Join or start Ray; ``before_starting`` runs first when a new local Ray is started
    (to overlap work with its start-up)."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        start_ray(address)  # probed first; sends the token a cluster under token auth needs
        return
    if not address:
        try:  # a cluster started on this machine: attach, as ray.init() does
            ray.init(address="auto", logging_level=logging.WARNING)
            return
        except ConnectionError:
            pass
    if before_starting is not None:
        before_starting()
    start_ray(None, preload=())  # XGBoost's actors never import torch
