"""Join a Ray cluster, or start an embedded local one, for the duration of a run."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import ray


@contextlib.contextmanager
def ray_session(address: str | None, *, num_cpus: int | None = None) -> Iterator[None]:
    """Use the Ray instance already running in this process, else connect to ``address``,
    else start a local one (shut down again on exit)."""
    if ray.is_initialized():
        yield
        return
    options: dict = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), **options)
    try:
        yield
    finally:
        ray.shutdown()
