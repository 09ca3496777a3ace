"""Ray Datasets: split into one part per actor, by blocks, near the actors."""

from __future__ import annotations

from typing import Any

RAY_DATASET_AVAILABLE = True


class RayDataset:
    supports_central_loading = True
    supports_distributed_loading = True

    @staticmethod
    def is_data_type(data: Any, filetype: Any = None) -> bool:
        return type(data).__module__.startswith("ray.data")
