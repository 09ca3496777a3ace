"""One embedded Ray instance for the whole test session (4 logical CPUs on any machine).

``make test`` runs two sessions side by side (pytest-xdist, ``-n 2 --dist loadfile``): each
has its own Ray, and a file's tests stay in one session, so a module's fixture (the
service test's cluster) is set up once. Test ids must be the same in both processes
(no object addresses in them): xdist checks that both collected the same tests. Tests
marked ``alone`` run after, in a session of their own with nothing beside it."""

from __future__ import annotations

import logging

import pytest

# XGBoost-Ray's own tests start and stop Ray themselves: they run in processes of their
# own (tests/test_xgboost_ray_suite.py, benchmarks/xgboost_ray_suite.py), never in this
# session, whose tests share one Ray.
collect_ignore = ["xgboost_ray_suite"]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING
        )
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The test process computes on one thread: its models are tiny (the single-process
    references, the analyses), and on 2 cores shared with the Ray workers more threads
    only contend. Measured on the noise-scale test's GPT: 1.7 CPU-s on one thread, 5.5-6.7
    on two (and 70 s of wall time in the suite at a load of 5); the service test's
    reference, 1.4 s against 57 s. The workers set their own
    (``threads`` of each run), unaffected."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def run_records_apart(tmp_path_factory):
    """The tests' runs leave their records (what the planner learns from) in a directory
    of their own: corrections learned from runs on this machine do not reach the tests'
    plans, nor do the tests' runs reach the machine's. Set in the environment, so the
    commands the tests run in subprocesses (``unipar train``, the service's runners)
    keep theirs apart too."""
    from unipar.cluster import run_records

    directory = tmp_path_factory.mktemp("unipar-run-records")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(run_records.RECORDS_DIR_VARIABLE, str(directory))
        yield directory
