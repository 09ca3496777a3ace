"""A traced run's outputs on the driver: the records every tracing rank sent, under the
cost model's prediction of the same plan on the same (live) cluster, written by
:func:`unipar.viz.trace.write_trace`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.plan import Plan
from unipar.ray_cluster.live import live_cluster_spec
from unipar.runtime.config import RunConfig
from unipar.viz.records import TraceRecord
from unipar.viz.trace import TraceOutputs, predicted_run_timeline, write_trace


def write_run_trace(
    profile: Callable[[], ModelProfile],
    plan: Plan,
    config: RunConfig,
    records: Sequence[TraceRecord],
    run_dir: Path,
    predicted_on: ClusterSpec | None = None,
) -> TraceOutputs:
    """``run_dir/trace.json`` and ``timeline.png``; measured vs predicted per component
    in the outputs' summary. ``predicted_on``: the cluster the run's step was predicted
    on (as the run started: corrections by earlier runs, not by this one's own record);
    ``None``: the connected Ray cluster as it is now. ``profile`` gives the analysis of
    the job's model (the preflight's); a model the analysis cannot take is drawn
    measured only, saying why."""
    predicted, missing = None, ""
    try:
        cluster = predicted_on if predicted_on is not None else _cluster(config, plan)
        predicted = predicted_run_timeline(profile(), plan, cluster)
    except Exception as error:  # the analysis of an arbitrary model: report, keep the trace
        missing = f"no prediction for this model ({type(error).__name__}: {error})"
    stages = plan.mesh.pp * plan.virtual_stages
    outputs = write_trace(run_dir, records, pp=plan.mesh.pp, stages=stages, predicted=predicted)
    return replace(outputs, summary=missing) if missing else outputs


def _cluster(config: RunConfig, plan: Plan) -> ClusterSpec:
    return live_cluster_spec(
        plan.mesh.world_size,
        cpus_per_worker=config.cpus_per_worker,
        gpus_per_worker=config.gpus_per_worker,
    )
