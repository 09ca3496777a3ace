"""Forget what DTensor cached about the meshes of a process group that is gone.

DTensor caches sharding decisions, redistribution plans and mesh topologies in
``functools`` caches keyed by its specs, and a :class:`~torch.distributed.device_mesh.DeviceMesh`
compares equal to any mesh of the same ranks, shape and dimension names. A worker that
leaves a gang and joins a new one with the same layout (an elastic gang grown back to its
first size) builds a new mesh equal to its first one (equality ignores the rank), and a
cached answer then hands back the first mesh, whose process groups were destroyed with the
first gang and whose group names were this process's under its first rank: "Could not
resolve the process group registered under the name 8" when the grown gang loads its
weights. So a rank forgets these caches when it leaves its group (``rendezvous.leave``).

The caches are DTensor's internals (torch 2.13); each is cleared where it exists, so a
torch that moves one loses nothing but that clearing (the grown-gang test then fails and
says so)."""

from __future__ import annotations

import sys
from typing import Any

import torch


def _caches() -> list[Any]:
    """Each of DTensor's caches that can hold a mesh, found by its torch 2.13 location."""
    from torch.distributed.tensor import (  # noqa: PLC0415 (heavy: DTensor)
        DTensor,
        _collective_utils,
        _redistribute,
    )

    propagator = DTensor._op_dispatcher.sharding_propagator
    found = [
        getattr(propagator.propagate_op_sharding, "cache", None),  # per thread
        getattr(propagator, "_propagate_tensor_meta_cached", None),
        getattr(_redistribute, "_gen_transform_infos", None),
        getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None),
    ]
    return [cache for cache in found if hasattr(cache, "cache_clear")]


def forget_meshes() -> None:
    """Clear DTensor's mesh-holding caches (see module doc): its dispatcher's native
    cache (C++) and the Python ones. A process that never imported DTensor has nothing
    cached: nothing is imported then."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    for cache in _caches():
        cache.cache_clear()
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:
        native()
