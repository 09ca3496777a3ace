"""Collectives as the cost model prices them: alpha-beta per ring level, with the
link each level crosses (Hockney's model; ring algorithms of Thakur et al. 2005), and
where the device's collective library does something else, what it does
(:class:`~unipar.cluster.spec.Collectives`). Pure arithmetic.

- ring all-reduce moves 2(n-1)/n of the data per device, reduce-scatter and all-gather
  (n-1)/n each, with one latency per ring step (Thakur et al. 2005); groups that span
  nodes reduce within the node first, so the network carries 1/g of the data per device
  (hierarchical all-reduce, as NCCL does);
- all-gather and reduce-scatter across nodes run as one ring over all ranks (NCCL has no
  tree for them): the latency term grows with the ranks, (n-1) inter-node hops;
- gloo's reduce-scatter is an all-reduce of the whole input (ProcessGroupGloo.cpp,
  ``reduce_scatter_tensor_coalesced``); gloo's broadcast a binomial tree
  (gloo/broadcast.cc).
"""

from __future__ import annotations

import functools
import math
from enum import Enum

from unipar.cluster.spec import ClusterSpec, Collectives, LinkSpec
from unipar.plan.representation import Mesh, MeshAxis

_AXIS_ORDER = (MeshAxis.TP, MeshAxis.CP, MeshAxis.FSDP, MeshAxis.DP, MeshAxis.PP)  # innermost first
Axes = MeshAxis | tuple[MeshAxis, ...]  # one axis, or neighbouring axes as one group


def _axes(axis: Axes) -> tuple[MeshAxis, ...]:
    return axis if isinstance(axis, tuple) else (axis,)


@functools.lru_cache(maxsize=4096)
def group_span(mesh: Mesh, axis: Axes, devices_per_node: int) -> tuple[int, int]:
    """(devices of one group on one node, nodes the group spans) for a mesh axis, with
    axes laid out innermost first in the order tp, cp, fsdp, dp, pp. ``axis`` may be
    neighbouring axes together (``(CP, DP)``: one group over both)."""
    names = _axes(axis)
    size = math.prod(mesh.size(a) for a in names)
    first = min(_AXIS_ORDER.index(a) for a in names)
    stride = math.prod(mesh.size(a) for a in _AXIS_ORDER[:first])
    per_node = 1 if stride >= devices_per_node else max(1, min(size, devices_per_node // stride))
    return per_node, math.ceil(size / per_node)


class Collective(Enum):
    """A collective as the cost model prices it: the multiple of (n-1)/n of the data
    each device moves per level of the ring (all-reduce 2, the others 1; Thakur et al.
    2005), but for what the device's collective library does instead
    (:class:`~unipar.cluster.spec.Collectives`)."""

    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"

    def fraction(self, library: Collectives) -> float:
        """2 for an all-reduce, 1 for a reduce-scatter or an all-gather; gloo's
        reduce-scatter is an all-reduce of the whole input (2)."""
        if self is Collective.ALL_REDUCE:
            return 2.0
        if self is Collective.REDUCE_SCATTER and library is Collectives.GLOO:
            return 2.0
        return 1.0


def ring_time(
    nbytes: float, mesh: Mesh, axis: Axes, cluster: ClusterSpec, *, collective: Collective
) -> float:
    """One ``collective`` of ``nbytes`` (the whole tensor: an all-reduce's input, a
    reduce-scatter's input, an all-gather's output) over ``axis``: times (n-1)/n of the
    data per device, per level (:meth:`Collective.fraction`). All-reduce is hierarchical
    (within nodes, then across); an all-gather or reduce-scatter that spans nodes is one
    ring over all its ranks, whose n-1 steps each pay the network's latency."""
    size = math.prod(mesh.size(a) for a in _axes(axis))
    if size == 1 or nbytes == 0:
        return 0.0
    fraction = collective.fraction(cluster.device.collectives)
    per_node, nodes = group_span(mesh, axis, cluster.devices_per_node)
    flat_ring = fraction == 1 and nodes > 1
    time = 0.0
    if per_node > 1:
        time += _ring_level(nbytes, per_node, cluster.intra_node, 1.0, fraction, not flat_ring)
    if nodes > 1:
        # The node's network is shared by all its devices: each of them (every group
        # on the node, and every member of each) sends its part at once, over its own
        # 1/devices_per_node of the node's network (one NIC per GPU, rail-optimised).
        share = 1 / cluster.devices_per_node
        time += _ring_level(nbytes / per_node, nodes, cluster.inter_node, share, fraction)
        if flat_ring:
            time += (size - nodes) * cluster.inter_node.latency_s
    return time


def owner_broadcasts_time(
    nbytes: float, tensors: float, mesh: Mesh, axis: Axes, cluster: ClusterSpec
) -> float:
    """Every one of ``tensors`` tensors (``nbytes`` in all) broadcast over ``axis`` from
    the rank that owns it, one after another: what the runtime's distributed optimizer
    does after each step (:mod:`unipar.runtime.parallel.distributed_optimizer`). A
    broadcast under gloo is a binomial tree of ceil(log2 n) rounds, each sending the
    whole tensor (gloo/broadcast.cc); under NCCL a pipelined ring, the tensor once
    over the link plus a latency per hop (NCCL's ring broadcast). Over nodes the
    network's share of one device is the link (as :func:`ring_time`)."""
    size = math.prod(mesh.size(a) for a in _axes(axis))
    if size == 1 or nbytes == 0:
        return 0.0
    _, nodes = group_span(mesh, axis, cluster.devices_per_node)
    if nodes > 1:
        link = cluster.inter_node
        bandwidth = link.bandwidth / cluster.devices_per_node
    else:
        link, bandwidth = cluster.intra_node, cluster.intra_node.bandwidth
    if cluster.device.collectives is Collectives.GLOO:
        rounds = math.ceil(math.log2(size))
        return rounds * (tensors * link.latency_s + nbytes / bandwidth)
    return tensors * (size - 1) * link.latency_s + nbytes / bandwidth


def _ring_level(
    nbytes: float, n: int, link: LinkSpec, share: float, fraction: float, latency: bool = True
) -> float:
    return fraction * (n - 1) / n * nbytes / (link.bandwidth * share) + latency * fraction * (
        n - 1
    ) * (link.latency_s)
