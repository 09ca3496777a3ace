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
    for ray_type, preset in _GPU_PRESETS.items():
        assert ray_type in PRESETS[preset].device.name, (ray_type, preset)
