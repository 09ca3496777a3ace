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


def test_a_move_asks_for_the_new_resources_and_gives_up_on_room_that_never_frees(ray_cluster):
    """A size target that names resources no node has (another node type, full): the new
    workers ask for them (they stay pending), the present member is misplaced, and once
    the wait is over it may leave first, the pending workers given up (the next gang's
    start then waits in the room it frees)."""
    from unipar.runtime.elastic.placement import WorkerPlacement
    from unipar.runtime.elastic.size_target import SizeTarget

    target = SizeTarget(1)
    placement = WorkerPlacement(target.resources, {"CPU": 1.0}, wait_s=30.0)

    def make():  # type: ignore[no-untyped-def]
        return ray.remote(_Slow).options(num_cpus=1, resources=placement.placed).remote(0.0)

    supervisor = Supervisor(make, placement.needs)
    members = supervisor.start(1, 30.0)
    try:
        assert members[0].resources == {"CPU": 1.0}  # what Ray assigned the process
        assert placement.misplaced(members) == []
        target.set(1, {"unipar_type_nowhere": 1.0})
        joiners: list = []
        placement.follow(supervisor, joiners)
        assert supervisor.needs == {"CPU": 1.0, "unipar_type_nowhere": 1.0}
        assert supervisor.room() == 0
        assert placement.misplaced(members) == members
        assert not placement.replaced(supervisor, 0, joiners, 1)  # started, not placed
        assert len(supervisor.pending) == 1 and joiners == []
        placement.wait_s = 0.0
        time.sleep(0.1)
        assert placement.replaced(supervisor, 0, joiners, 1)  # leave first
        assert supervisor.pending == [] and joiners == []
    finally:
        supervisor.cancel_pending()
        supervisor.kill(members)


def test_a_start_waiting_for_a_type_begins_again_when_the_type_changes(ray_cluster):
    """A gang starting on a node type whose room does not come: when the size target names
    another type meanwhile, the waiting workers are stopped and the start begins again with
    the new one (else it would wait out its whole timeout, and fail)."""
    import threading

    from unipar.runtime.elastic.placement import WorkerPlacement
    from unipar.runtime.elastic.size_target import SizeTarget

    target = SizeTarget(1, {"unipar_type_nowhere": 1.0})
    placement = WorkerPlacement(target.resources, {"CPU": 1.0}, wait_s=30.0)

    def make():  # type: ignore[no-untyped-def]
        return ray.remote(_Slow).options(num_cpus=1, resources=placement.placed).remote(0.0)

    supervisor = Supervisor(make, placement.needs)
    threading.Timer(1.0, lambda: target.set(1, {})).start()  # the scheduler's new choice
    began = time.monotonic()
    members = placement.start(supervisor, 1, 60.0, lambda: 1)
    try:
        assert len(members) == 1 and members[0].resources == {"CPU": 1.0}
        assert time.monotonic() - began < 30.0  # not the whole timeout
        assert placement.placed == {} and supervisor.needs == {"CPU": 1.0}
    finally:
        supervisor.kill(members)
