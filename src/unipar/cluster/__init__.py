"""Cluster descriptions for the planner: presets and a calibrated CPU."""

from unipar.cluster.spec import (
    PRESETS,
    AttentionKernel,
    ClusterSpec,
    DeviceSpec,
    Kernels,
    LinkSpec,
    Precision,
    cluster_preset,
)

__all__ = [
    "PRESETS",
    "AttentionKernel",
    "ClusterSpec",
    "DeviceSpec",
    "Kernels",
    "LinkSpec",
    "Precision",
    "cluster_preset",
]
