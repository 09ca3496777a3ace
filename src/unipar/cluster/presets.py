"""A cluster by name: the published presets of :mod:`unipar.cluster.spec`, or this
machine's CPU, measured (:mod:`unipar.cluster.calibrate`)."""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from unipar.cluster.spec import PRESETS, AttentionKernel, ClusterSpec, Kernels
from unipar.errors import ConfigError


def cluster_preset(
    name: str,
    *,
    nodes: int = 1,
    devices_per_node: int | None = None,
    attention: AttentionKernel | str | None = None,
    kernels: Kernels | str | None = None,
) -> ClusterSpec:
    """A preset by name (``a100-80g``, ``a100-40g``, ``h100-80g``, ``h100-96g-hbm2e``,
    ``h200-141g``, ``v100-16g``, ``cpu``). ``attention``: the attention kernel, if not the
    preset's (GPUs: flash; V100 and CPU: math), e.g. ``math`` for runs made before fused
    attention. ``kernels``: ``eager`` for a framework that runs eager PyTorch
    (:class:`Kernels`)."""
    if name == "cpu":
        # measuring the CPU needs torch; the other presets are numbers, read without it
        from unipar.cluster.calibrate import calibrated_cpu_cluster  # noqa: PLC0415 (heavy: torch)

        cluster = calibrated_cpu_cluster(nodes=nodes, devices_per_node=devices_per_node or 2)
    elif name not in PRESETS:
        raise ConfigError(
            f"unknown cluster preset {name!r}; known presets: "
            f"{', '.join([*sorted(PRESETS), 'cpu'])}"
        )
    else:
        cluster = PRESETS[name].resized(nodes, devices_per_node)
    device = cluster.device
    if attention is not None:
        device = replace(device, attention=_option(AttentionKernel, "attention", attention))
    if kernels is not None:
        device = replace(device, kernels=_option(Kernels, "kernels", kernels))
    return replace(cluster, device=device)


def _option(kind: type[Enum], what: str, value: object) -> Enum:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(
            f"{what} must be one of {[k.value for k in kind]}, but got {value!r}"
        ) from None
