"""Corrections a cluster learned from its own runs: a few rate factors, each the speed
measured runs showed against the rate the preset or the calibration gave. Pure.

A factor multiplies a rate: ``compute x0.71`` means the kernels ran at 71% of the
rate the spec sheet (or the CPU calibration) gives, so the cost model's compute time
grows by 1/0.71. The groups are the cost model's own terms (:mod:`unipar.plan.cost`),
each priced by one or two numbers of :class:`ClusterSpec`:

- ``compute``: the FLOP rate and memory bandwidth of the kernels (the roofline's two
  rates, scaled together, so that the roofline keeps its shape);
- ``per-op``: the fixed cost of one operation (launch, dispatch, autograd record);
- ``framework``: the framework's own time per tensor-parallel layer (DTensor dispatch,
  with sequence parallelism's layouts);
- ``sharding``: FSDP's own time per unit and per sharded parameter (hooks, buffers, the
  optimizer on DTensors): another mechanism than tensor parallelism's, calibrated apart,
  so that what runs of one teach does not move the other's;
- ``intra-node link`` and ``network``: the effective bandwidth of each link class (its
  latency scaled alike);
- ``optimizer``: the bytes per second of the optimizer step.

Every time term of the cost model is one of these rates' work over the rate, so the
predicted step time is a sum of the groups' seconds, each scaled by 1/factor (the
model is homogeneous of degree one in the groups' times); the fit of the factors
(:mod:`unipar.cluster.learned_fit`) rests on that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from unipar.cluster.spec import ClusterSpec, Corrections, LinkSpec, Rate

__all__ = ["Corrections", "Rate", "base_cluster", "corrected", "scaled_times"]


def base_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` as specified or calibrated, without learned corrections."""
    corrections = cluster.corrections
    return cluster if corrections is None else corrections.base


def corrected(
    cluster: ClusterSpec, factors: Mapping[Rate, float], *, runs: int, kept_apart: int = 0
) -> ClusterSpec:
    """``cluster`` (its base, if corrected already) with each group's rates multiplied
    by its factor (1 where none is given)."""
    base = base_cluster(cluster)

    def f(rate: Rate) -> float:
        return float(factors.get(rate, 1.0))

    compute, per_op, framework, sharding, optimizer = (
        f(Rate.COMPUTE),
        f(Rate.PER_OP),
        f(Rate.FRAMEWORK),
        f(Rate.SHARDING),
        f(Rate.OPTIMIZER),
    )
    d = base.device
    device = replace(
        d,
        peak_flops_16bit=d.peak_flops_16bit * compute,
        peak_flops_32bit=d.peak_flops_32bit * compute,
        memory_bandwidth=d.memory_bandwidth * compute,
        kernel_overhead_s=d.kernel_overhead_s / per_op,
        host_op_s=d.host_op_s / per_op,
        sharded_op_overhead_s=d.sharded_op_overhead_s / framework,
        sequence_parallel_op_overhead_s=d.sequence_parallel_op_overhead_s / framework,
        fsdp_unit_overhead_s=d.fsdp_unit_overhead_s / sharding,
        fsdp_step_overhead_s=d.fsdp_step_overhead_s / sharding,
        fsdp_tensor_overhead_s=d.fsdp_tensor_overhead_s / sharding,
        fsdp_gather_overhead_s=d.fsdp_gather_overhead_s / sharding,
        # the optimizer's own rate, apart from the kernels' memory bandwidth
        optimizer_bandwidth=(d.optimizer_bandwidth or d.memory_bandwidth) * optimizer,
    )
    applied = tuple((rate, f(rate)) for rate in Rate)
    return replace(
        base,
        device=device,
        intra_node=_scaled(base.intra_node, f(Rate.INTRA_NODE)),
        inter_node=_scaled(base.inter_node, f(Rate.INTER_NODE)),
        corrections=Corrections(applied, runs, base, kept_apart),
    )


def _scaled(link: LinkSpec, factor: float) -> LinkSpec:
    return LinkSpec(bandwidth=link.bandwidth * factor, latency_s=link.latency_s / factor)


def scaled_times(cluster: ClusterSpec, rate: Rate, time_factor: float) -> ClusterSpec:
    """``cluster`` with the times of one group multiplied by ``time_factor`` (its rate
    divided by it), the other groups as they are: what the sensitivity of a
    prediction to one group is measured with."""
    factors = {r: cluster.corrections.factor(r) if cluster.corrections else 1.0 for r in Rate}
    factors[rate] /= time_factor
    runs = cluster.corrections.runs if cluster.corrections else 0
    return corrected(cluster, factors, runs=runs)
