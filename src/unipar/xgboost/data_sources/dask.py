"""Dask DataFrames, Series and arrays: computed to pandas (or numpy) on the driver, then
split by rows like any in-memory data (Dask is not a dependency; nothing here imports
it)."""

from __future__ import annotations

import importlib.util
from typing import Any

DASK_INSTALLED = importlib.util.find_spec("dask") is not None


class Dask:
    supports_central_loading = True
    supports_distributed_loading = False

    @staticmethod
    def is_data_type(data: Any, filetype: Any = None) -> bool:
        return type(data).__module__.startswith("dask.")

    @staticmethod
    def load_data(data: Any, **_: Any) -> Any:
        return data.compute()
