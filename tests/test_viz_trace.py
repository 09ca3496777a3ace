"""Measured traces: a real 2-stage pipeline on 2 CPU processes records one block per
action of its schedule; the outputs; tracing off leaves nothing attached; bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from png_checks import check_png

from unipar.cluster import cluster_preset
from unipar.cluster.run_records import RECORDS_DIR_VARIABLE
from unipar.errors import ConfigError
from unipar.plan import Plan
from unipar.plan.for_job import job_facts
from unipar.runtime.metrics import read_metrics
from unipar.runtime.run import fit
from unipar.runtime.step_records import CheckpointPolicy
from unipar.runtime.tracing import (
    Attachment,
    StepTracer,
    TracedAction,
    attach_tracer,
    trace_pipeline,
    traced_step,
    traced_steps,
)
from unipar.runtime.trainer import Trainer
from unipar.testing import tiny_gpt_job
from unipar.viz.schedule_order import ActionKind, _RecordingStage, pipeline_order
from unipar.viz.trace import (
    ComponentError,
    compare,
    predicted_run_timeline,
    summary_text,
    write_trace,
)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def pipeline_run(ray_cluster, tmp_path_factory):
    """A real run through ``fit``: the planner's 2-stage 1F1B plan on 2 Ray workers for 6
    steps, the last 2 traced (the job and plan of benchmarks/trace_overhead.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        import trace_overhead

    plan = trace_overhead.pipeline_plan(6)
    result = fit(
        trace_overhead.job(6),
        workers=2,
        plan=plan,
        run_dir=tmp_path_factory.mktemp("traced"),
        trace_steps=2,
        progress=False,
        checkpoint_every=6,  # one checkpoint, not one a step: none is read
    )
    return trace_overhead, plan, result


def test_one_measured_block_per_action_of_the_schedule(pipeline_run):
    _, plan, result = pipeline_run
    records = result.trace.records
    traced = [4, 5]
    assert sorted({r.step for r in records}) == traced  # nothing outside them
    order = pipeline_order(plan.schedule, plan.mesh.pp, plan.num_microbatches)
    kinds = {TracedAction.FORWARD: ActionKind.FORWARD, TracedAction.BACKWARD: ActionKind.BACKWARD}
    for step in traced:
        for rank in range(plan.mesh.pp):
            mine = sorted(
                (r for r in records if r.step == step and r.rank == rank),
                key=lambda r: r.start_ns,
            )
            measured = [(r.stage, kinds[r.action], r.microbatch) for r in mine if r.action in kinds]
            assert measured == [(a.stage, a.kind, a.microbatch) for a in order[rank]]
            counts = Counter(r.action for r in mine)
            assert counts[TracedAction.GRAD_SYNC] == 1 and counts[TracedAction.OPTIMIZER] == 1
            assert all(r.end_ns >= r.start_ns for r in mine)


def test_the_run_writes_its_trace_and_summarises_it(pipeline_run):
    _, _, result = pipeline_run
    trace = result.trace
    assert trace.trace_json == result.run_dir / "trace.json"
    events = json.loads(trace.trace_json.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(trace.records)
    check_png(trace.timeline_png)
    summary = result.summary()
    for component in ("forward", "backward", "grad sync", "optimizer", "idle share", "step"):
        assert f"    {component}" in summary
    assert "predicted" in summary and str(trace.trace_json) in summary


def test_the_run_states_its_prediction_error_and_its_metrics_carry_the_prediction(
    pipeline_run,
):
    """Every run, traced or not, compares its steady steps (after the warm-up) with the
    plan's prediction; a run this short is not learned from."""
    _, _, result = pipeline_run
    (check,) = result.predictions
    assert check.predicted_s > 0 and check.measured_s > 0 and check.steps == (2, 5)
    summary = result.summary()
    assert "(median of steps 2-5) against predicted" in summary
    assert "not learned from: 4 steady steps" in summary
    steps = read_metrics(result.metrics_path)
    assert {m["predicted_step_s"] for m in steps} == {check.predicted_s}


def test_data_parallel_trace_times_each_microbatch_on_one_replica(ray_cluster, tmp_path):
    """Without a pipeline each micro-batch's forward and backward is a span; of the two
    replicas only the first records (they run the same actions)."""
    job = tiny_gpt_job(steps=3, global_batch_size=8)
    plan = Plan.data_parallel(2, 8, microbatch_size=2)  # 2 micro-batches per replica
    result = fit(
        job, workers=2, plan=plan, run_dir=tmp_path, trace_steps=1, progress=False, elastic=False
    )
    records = result.trace.records
    assert {(r.rank, r.stage, r.step) for r in records} == {(0, 0, 2)}
    assert [(r.action, r.microbatch) for r in sorted(records, key=lambda r: r.start_ns)] == [
        (TracedAction.FORWARD, 0),
        (TracedAction.BACKWARD, 0),
        (TracedAction.FORWARD, 1),
        (TracedAction.BACKWARD, 1),
        (TracedAction.OPTIMIZER, None),
    ]


def test_trace_outputs(pipeline_run, tmp_path):
    bench, plan, result = pipeline_run
    records = result.trace.records
    predicted = predicted_run_timeline(
        job_facts(bench.job(6)).profile, plan, cluster_preset("a100-80g")
    )
    outputs = write_trace(tmp_path, records, pp=2, stages=2, predicted=predicted)
    events = json.loads(outputs.trace_json.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(records)
    check_png(outputs.timeline_png)
    names = [line.split()[0] for line in outputs.summary.splitlines()[1:]]
    assert names == ["forward", "backward", "grad", "optimizer", "idle", "step"]
    assert compare([predicted], predicted)[-1].relative_error == 0.0


def test_tracing_off_attaches_nothing_and_remove_detaches(tmp_path):
    job = tiny_gpt_job(steps=4, global_batch_size=4)
    trainer = Trainer(
        job,
        Plan.data_parallel(1, 4),
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=CheckpointPolicy(tmp_path, 10**9, 1),
    )
    trainer.setup(None)
    optimizer = trainer.optimizers[0]
    assert trainer.model.tracer is None
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    tracer = StepTracer(0, traced_steps(2, 0, 4))
    attachment = attach_tracer(trainer, tracer)
    for step in range(4):
        traced_step(trainer, step, tracer)
    each = [TracedAction.FORWARD, TracedAction.BACKWARD, TracedAction.OPTIMIZER]
    assert [(r.step, r.action) for r in tracer.records] == [(2, a) for a in each] + [
        (3, a) for a in each
    ]
    attachment.remove()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert trainer.model.tracer is None


def test_stage_wrappers_are_removed():
    stage = _RecordingStage(0, 2, 2)
    schedule = type("Schedule", (), {"_stage": stage})()
    tracer = StepTracer(0, range(1))
    attachment = Attachment()
    trace_pipeline(schedule, tracer, attachment)
    tracer.begin_step(0)
    stage.forward_one_chunk(3)
    tracer.end_step()
    assert [(r.action, r.microbatch) for r in tracer.records] == [(TracedAction.FORWARD, 3)]
    attachment.remove()
    assert "forward_one_chunk" not in vars(stage)


@pytest.mark.parametrize("n", [0, -1, 5])
def test_trace_steps_out_of_range(n):
    with pytest.raises(ConfigError, match=f"between 1 and the 4 step.*got {n}"):
        traced_steps(n, 6, 10)


def test_the_idle_share_error_is_in_points_not_relative():
    """A one-stage run predicts no idle time; its rounding residue (-1e-18 seen on an H100)
    once read as an error of -2.9e15 %. A share's error is its difference in points."""
    rows = [
        ComponentError("step", measured_s=0.2485, predicted_s=0.2500),
        ComponentError("idle share", measured_s=0.003, predicted_s=-1.2e-18),
    ]
    step, idle = summary_text(rows).splitlines()[1:]
    assert step.split()[-1] == "-1%"
    assert idle.split()[-3:] == ["0.0%", "+0.3", "pt"]
    assert rows[1].relative_error is None


def test_a_traced_runs_prediction_is_the_one_it_started_with(ray_cluster, tmp_path, monkeypatch):
    """The trace's predicted timeline prices the plan as the run's own check did, before
    the run's record taught the cluster anything: a run long enough to be learned from
    (12 steady steps) does not correct its own prediction."""
    monkeypatch.setenv(RECORDS_DIR_VARIABLE, str(tmp_path / "records"))
    # the record counts whatever the suite's load (an overloaded run's is kept apart and
    # corrects nothing, which would let a wrong prediction pass)
    monkeypatch.setattr("unipar.runtime.learn.machine_load", lambda: (0.0, 2))
    job = tiny_gpt_job(steps=14, global_batch_size=8)
    plan = Plan.data_parallel(2, 8)
    result = fit(
        job,
        workers=2,
        plan=plan,
        run_dir=tmp_path / "run",
        trace_steps=2,
        progress=False,
        elastic=False,
    )
    check = result.predictions[-1]
    assert check.learned.startswith("learned for the next plan")
    step = next(line for line in result.trace.summary.splitlines() if line.startswith("step"))
    assert step.split()[3:5] == [f"{1e3 * check.predicted_s:.2f}", "ms"]
