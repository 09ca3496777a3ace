"""Plans for tests, made by the planner with pinned choices (a fixed cluster preset,
so the choice does not depend on this machine's calibration)."""

from __future__ import annotations

from unipar.cluster import cluster_preset
from unipar.job import Job
from unipar.plan import Constraints, Plan, plan
from unipar.plan.for_job import job_model_spec


def planned(job: Job, workers: int, **pinned) -> Plan:  # type: ignore[no-untyped-def]
    axes = {axis: pinned.pop(axis, 1) for axis in ("dp", "fsdp", "tp", "pp", "cp")}
    assert axes["dp"] * axes["fsdp"] * axes["tp"] * axes["pp"] * axes["cp"] == workers
    cluster = cluster_preset("a100-80g", nodes=1, devices_per_node=workers)
    report = plan(
        job_model_spec(job),
        cluster,
        job.global_batch_size,
        constraints=Constraints(**axes, runtime_only=True, **pinned),
    )
    return report.best.plan
