"""Modin DataFrames and Series: gathered to pandas on the driver, then split by rows
like any in-memory data (Modin is not a dependency; nothing here imports it)."""

from __future__ import annotations

import importlib.util
from typing import Any

MODIN_INSTALLED = importlib.util.find_spec("modin") is not None


class Modin:
    supports_central_loading = True
    supports_distributed_loading = False

    @staticmethod
    def is_data_type(data: Any, filetype: Any = None) -> bool:
        return type(data).__module__.startswith("modin.")

    @staticmethod
    def load_data(data: Any, **_: Any) -> Any:
        return data._to_pandas()
