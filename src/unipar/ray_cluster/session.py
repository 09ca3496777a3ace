"""Join a Ray cluster, or start an embedded local one, for the duration of a run."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from unipar.errors import ResourceError
from unipar.ray_cluster.address import check_cluster, joins_a_cluster


@contextlib.contextmanager
def ray_session(address: str | None, *, num_cpus: int | None = None) -> Iterator[None]:
    """Use the Ray instance already running in this process, else connect to ``address``,
    else start a local one (shut down again on exit)."""
    if ray.is_initialized():
        yield
        return
    start_ray(address, num_cpus=num_cpus)
    try:
        yield
    finally:
        ray.shutdown()


class _DropTokenAuthNotice(logging.Filter):
    """Ray 2.60 says on every start that token authentication is on (its default); the
    warning that it is off still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
    _DropTokenAuthNotice()
)


# What a training worker imports first: a local cluster's idle worker processes import it
# as they start (Ray's ``preload_python_modules``), while the driver loads the job, so a
# training actor finds it imported (measured on 2 cores: an actor's ``import torch``
# 3.8 s -> 0.2 s under load; unipar's worker and DCP a further 1.0 s once torch is in).
# On a cluster started with ``ray start``, the same is ``ray start --head`` with
# ``RAY_preload_python_modules`` set to these names joined by commas.
TRAINING_PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "unipar.runtime.elastic.worker",
    "unipar.runtime.trainer",
)


def start_ray(
    address: str | None,
    *,
    num_cpus: int | None = None,
    checked: bool = False,
    preload: tuple[str, ...] = TRAINING_PRELOAD,
) -> None:
    """Connect to ``address`` (checked first: an unreachable or incompatible cluster
    fails within seconds, see :mod:`unipar.ray_cluster.address`), or start a local Ray without
    its dashboard (never joining a cluster ``ray start`` left on this machine), whose
    worker processes import ``preload`` as they start.
    ``checked``: ``address`` already passed :func:`~unipar.ray_cluster.address.check_cluster`."""
    options: dict = {"include_dashboard": False, "logging_level": logging.WARNING}
    if joins_a_cluster(address):
        ray.init(address=address if checked else check_cluster(address), **options)
    else:
        # Ray runs worker processes at nice 15 by default, below its own daemons; in a
        # cluster started just for this run the workers are the work, so they run at 0
        # (measured: 5% more steps/s on 2 busy cores).
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            _system_config={"worker_niceness": 0}
            | ({"preload_python_modules": list(preload)} if preload else {}),
            **options,
        )


def require_resources(per_unit: dict[str, float], units: int, unit: str) -> None:
    """Fail at once, before anything starts, when the cluster is too small in total for
    ``units`` processes (``unit``: "worker", "actor") of ``per_unit`` resources each.
    (Resources that other jobs hold are waited for: :func:`reserve_bundles`.)"""
    total = ray.cluster_resources()
    for resource, each in per_unit.items():
        have = total.get(resource, 0.0)
        if each and each * units > have:
            fits = int(have // each)
            if fits >= 1:
                advice = f"use at most {fits} {unit}s, fewer {resource}s per {unit}"
            elif have > 0:
                advice = f"use at most {have:g} {resource}s per {unit}"
            else:
                advice = f"run without {resource}s ({resource.lower()}s_per_{unit}=0)"
            raise ResourceError(
                f"the run needs {each * units:g} {resource}s ({units} {unit}s x {each:g} "
                f"{resource} each), but the Ray cluster has {have:g}; {advice}, or a "
                "larger cluster"
            )


def _shortfall(bundle: dict[str, float], count: int) -> str:
    """What of ``count`` x ``bundle`` is not free now, e.g. "2 CPUs (1 free of 4)"."""
    free, total = ray.available_resources(), ray.cluster_resources()
    short = [
        f"{each * count:g} {name}s ({free.get(name, 0.0):g} free of {total.get(name, 0.0):g})"
        for name, each in bundle.items()
        if each and each * count > free.get(name, 0.0)
    ]
    return ", ".join(short)


def say_waiting(bundle: dict[str, float], count: int, unit: str, timeout_s: float) -> None:
    """Say on stderr that ``count`` x ``bundle`` are waited for, up to ``timeout_s``,
    because other jobs hold them."""
    busy = _shortfall(bundle, count) or f"{count} {unit}s of {bundle} on few enough nodes"
    print(
        f"unipar: waiting up to {timeout_s:g} s for {busy}: other jobs hold them "
        "(placement_timeout_s / --placement-timeout sets the wait)",
        file=sys.stderr,
        flush=True,
    )


def reserve_bundles(
    bundle: dict[str, float],
    count: int,
    unit: str,
    *,
    strategy: str = "PACK",
    timeout_s: float = 60.0,
    notice_after_s: float = 1.0,
) -> Any:
    """A placement group of ``count`` copies of ``bundle``, ready. When other jobs hold
    the resources, it says so on stderr after ``notice_after_s`` and waits; if they are
    not free within ``timeout_s``, the group is removed and a ResourceError says why."""
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=min(notice_after_s, timeout_s))
    if not ready:
        say_waiting(bundle, count, unit, timeout_s)
        ready, _ = ray.wait([group.ready()], timeout=max(0.0, timeout_s - notice_after_s))
    if not ready:
        busy = _shortfall(bundle, count)
        remove_placement_group(group)
        raise ResourceError(
            f"could not place {count} {unit}s of {bundle} within {timeout_s:g} s: "
            f"{'the cluster has ' + busy if busy else 'no node has room for them'}; wait for "
            f"other jobs to finish, use fewer or smaller {unit}s, or wait longer "
            "(placement_timeout_s / --placement-timeout)"
        )
    return group
