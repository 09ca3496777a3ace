"""Cluster descriptions for the planner: presets and a calibrated CPU."""

from unipar.cluster.spec import (
    PRESETS,
    ClusterSpec,
    DeviceSpec,
    LinkSpec,
    Precision,
    cluster_preset,
)

__all__ = ["PRESETS", "ClusterSpec", "DeviceSpec", "LinkSpec", "Precision", "cluster_preset"]
