"""Cluster descriptions for the planner: presets and a calibrated CPU."""

from unipar.cluster.presets import cluster_preset
from unipar.cluster.spec import (
    PRESETS,
    AttentionKernel,
    ClusterSpec,
    DeviceSpec,
    Kernels,
    LinkSpec,
    Precision,
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
