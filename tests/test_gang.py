"""The gang supervisor on a local Ray: a start bounded by an outside size that falls while
the members start up stops the members past it at once, and their CPUs come back."""

from __future__ import annotations

import sys
import time

import ray
import ray.cloudpickle

from unipar.ray_cluster.supervisor import Supervisor, describe_process

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Slow:
    """A member whose start-up takes ``seconds`` (as a worker importing torch does)."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    def describe(self):  # type: ignore[no-untyped-def]
        return describe_process()


def test_a_start_stops_the_members_past_a_bound_that_falls(ray_cluster):
    fast = ray.remote(_Slow).options(num_cpus=1)
    supervisor = Supervisor(lambda: fast.remote(0.5), {"CPU": 1.0})
    members = supervisor.start(3, 30.0, most=lambda: 3)
    assert len(members) == 3
    supervisor.kill(members)
    slow = ray.remote(_Slow).options(num_cpus=1)
    supervisor = Supervisor(lambda: slow.remote(4.0), {"CPU": 1.0})
    began = time.monotonic()
    free_meanwhile: list[float] = []

    def most() -> int:  # 3, then 1 from a second in, while all three still start up
        age = time.monotonic() - began
        if 2.5 < age < 3.5:
            free_meanwhile.append(ray.available_resources().get("CPU", 0.0))
        return 3 if age < 1.0 else 1

    members = supervisor.start(3, 30.0, most=most)
    assert len(members) == 1
    # the two past the bound gave their CPUs back while the third was still starting
    assert free_meanwhile and max(free_meanwhile) >= 3.0, free_meanwhile
    supervisor.kill(members)
