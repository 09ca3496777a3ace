"""One embedded Ray instance for the whole test session (4 logical CPUs on any machine)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING
        )
    yield ray
    ray.shutdown()
