"""DataFrames or arrays already in Ray's object store, given as a list of ``ObjectRef``."""

from __future__ import annotations

from typing import Any

import ray


class ObjectStore:
    supports_central_loading = True
    supports_distributed_loading = True

    @staticmethod
    def is_data_type(data: Any, filetype: Any = None) -> bool:
        if isinstance(data, ray.ObjectRef):
            return True
        return (
            isinstance(data, (list, tuple))
            and len(data) > 0
            and all(isinstance(d, ray.ObjectRef) for d in data)
        )
