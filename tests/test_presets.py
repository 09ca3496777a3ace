"""GPU presets: each type Ray reports maps to a preset of that device."""

from __future__ import annotations

from unipar.cluster import PRESETS, cluster_preset
from unipar.cluster.hetero import RAY_ACCELERATOR_PRESETS as _GPU_PRESETS


def test_h200_has_its_own_preset():
    h200, h100 = PRESETS[_GPU_PRESETS["H200"]].device, PRESETS[_GPU_PRESETS["H100"]].device
    assert h200.name.startswith("H200") and h100.name.startswith("H100")
    assert h200.peak_flops_16bit == h100.peak_flops_16bit == 989e12
    assert (h200.memory_gib, h200.memory_bandwidth) == (141, 4.8e12)
    assert cluster_preset("h200-141g", nodes=2).num_devices == 16


def test_every_ray_accelerator_type_names_its_own_device():
    """Ray's type (``A100``, or ``A100-40G`` with its memory) names the preset's chip,
    and its memory where it gives one."""
    for ray_type, preset in _GPU_PRESETS.items():
        chip, _, memory = ray_type.partition("-")
        device = PRESETS[preset].device
        assert device.name.startswith(chip), (ray_type, preset)
        if memory:
            assert round(device.memory_gib) == int(memory.removesuffix("G")), (ray_type, preset)
