"""Join Ray as XGBoost-Ray's ``train`` does (``ray.init()``): the cluster named by
``RAY_ADDRESS``, else one already running on this machine (``ray start --head``), else a
new local one (which stays up until the process exits, so ``train`` then ``predict``
start it once); and run a call's driver part in a task on this node."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from unipar.ray_cluster.address import joins_a_cluster
from unipar.ray_cluster.session import start_ray


def attach_or_start_ray(before_starting: Callable[[], None] | None = None) -> None:
    """Join or start Ray; ``before_starting`` runs first when a new local Ray is started
    (to overlap work with its start-up)."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if joins_a_cluster(address):
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


def run_on_this_node(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` run by a Ray task pinned to this node, its result
    returned (XGBoost-Ray's ``_remote``: the driver's part of a call runs inside the
    cluster, as Ray Client users need)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    task = ray.remote(num_cpus=0)(function).options(scheduling_strategy=here)
    return ray.get(task.remote(*args, **kwargs))
