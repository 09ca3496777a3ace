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
from unipar.errors import ConfigError
from unipar.plan import Plan
from unipar.runtime.tracing import (
    Attachment,
    StepTracer,
    TracedAction,
    attach_tracer,
    trace_pipeline,
    traced_step,
    traced_steps,
)
from unipar.runtime.trainer import CheckpointPolicy, Trainer
from unipar.testing import tiny_gpt_job
from unipar.viz.schedule_order import ActionKind, _RecordingStage, pipeline_order
from unipar.viz.trace import compare, predicted_run_timeline, write_trace

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def pipeline_run():
    """2 warm-up steps, 2 untraced, 2 traced (benchmarks/trace_overhead.py's runner)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        import trace_overhead

        plan = trace_overhead.pipeline_plan(6)
        return trace_overhead, plan, trace_overhead.measure(plan, blocks=2, block_steps=2)


def test_one_measured_block_per_action_of_the_schedule(pipeline_run):
    bench, plan, result = pipeline_run
    traced = [bench.WARMUP + 2, bench.WARMUP + 3]
    assert sorted({r.step for r in result.records}) == traced  # nothing outside them
    order = pipeline_order(plan.schedule, plan.mesh.pp, plan.num_microbatches)
    kinds = {TracedAction.FORWARD: ActionKind.FORWARD, TracedAction.BACKWARD: ActionKind.BACKWARD}
    for step in traced:
        for rank in range(plan.mesh.pp):
            mine = sorted(
                (r for r in result.records if r.step == step and r.rank == rank),
                key=lambda r: r.start_ns,
            )
            measured = [(r.stage, kinds[r.action], r.microbatch) for r in mine if r.action in kinds]
            assert measured == [(a.stage, a.kind, a.microbatch) for a in order[rank]]
            counts = Counter(r.action for r in mine)
            assert counts[TracedAction.GRAD_SYNC] == 1 and counts[TracedAction.OPTIMIZER] == 1
            assert all(r.end_ns >= r.start_ns for r in mine)


def test_trace_outputs(pipeline_run, tmp_path):
    bench, plan, result = pipeline_run
    predicted = predicted_run_timeline(bench.job(6), plan, cluster_preset("a100-80g"))
    outputs = write_trace(tmp_path, result.records, pp=2, stages=2, predicted=predicted)
    events = json.loads(outputs.trace_json.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(result.records)
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
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    tracer = StepTracer(0, traced_steps(2, 0, 4))
    attachment = attach_tracer(trainer, tracer)
    for step in range(4):
        traced_step(trainer, step, tracer)
    assert [(r.step, r.action) for r in tracer.records] == [
        (2, TracedAction.OPTIMIZER),
        (3, TracedAction.OPTIMIZER),
    ]
    attachment.remove()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


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
