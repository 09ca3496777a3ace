"""Cost of tracing: steps/s of a 2-stage pipeline (1F1B) on 2 CPU processes, traced and
untraced, alternated in one invocation (untraced, traced, untraced, traced).

Each process runs unipar's own Trainer (the code each Ray worker runs) under a gloo
process group started here; the tracer is attached as ``Trainer.trace`` attaches it in a run
(:func:`unipar.runtime.tracing.attach_tracer` / ``traced_step``). The untraced rounds
run ``trainer.train_step`` with nothing attached. The last traced round also writes
``trace.json``, ``timeline.png`` (measured under predicted) and the summary into
``--out`` (default: a temporary directory).

    python benchmarks/trace_overhead.py [--steps 12] [--out DIR]

Last line: ``RESULT trace_overhead=<1 - traced steps/s / untraced steps/s, the median over
pairs of consecutive untraced and traced steps>
trace_overhead_estimate=<the tracer's own cost per step / untraced step>``: on a machine
shared with other work the first is noisy, the second is the tracer's measured cost per
span times the spans of a step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from unipar.cluster import cluster_preset
from unipar.models.gpt import GPTConfig
from unipar.plan import Constraints, Plan, plan
from unipar.plan.for_job import job_facts, job_model_spec
from unipar.plan.representation import PipelineSchedule
from unipar.runtime.step_records import CheckpointPolicy
from unipar.runtime.tracing import (
    StepTracer,
    TracedAction,
    TraceRecord,
    attach_tracer,
    traced_step,
    traced_steps,
)
from unipar.runtime.trainer import Trainer
from unipar.testing import tiny_gpt_job

WORKERS = 2
WARMUP = 2  # steps left out of steps/s (first-step allocations)
CONFIG = GPTConfig(vocab_size=256, seq_len=64, hidden=96, layers=4, heads=4, dropout=0.0)


def job(steps: int):  # type: ignore[no-untyped-def]
    return tiny_gpt_job(steps=steps, global_batch_size=16, dataset_size=512, config=CONFIG)


def pipeline_plan(steps: int) -> Plan:
    """The planner's 2-stage 1F1B plan, 4 micro-batches of 4 (a fixed preset, so the
    plan does not depend on this machine)."""
    fixed = Constraints(
        pp=2, tp=1, dp=1, fsdp=1, microbatch_size=4, schedule=PipelineSchedule.ONE_F_ONE_B
    )
    cluster = cluster_preset("a100-80g", devices_per_node=WORKERS)
    the_job = job(steps)
    return plan(
        job_model_spec(the_job), cluster, the_job.global_batch_size, constraints=fixed
    ).best.plan


def _worker(rank: int, port: int, plan_json: str, blocks: int, block_steps: int, out: str) -> None:
    """Warm-up steps, then ``blocks`` blocks of ``block_steps`` steps, untraced and traced
    in turn (the tracer attached for a traced block, removed after it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORKERS)
    the_plan = Plan.from_json(plan_json)
    total = WARMUP + blocks * block_steps
    durations: dict[str, list[float]] = {"untraced": [], "traced": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            job(total),
            the_plan,
            rank=rank,
            world_size=WORKERS,
            device=torch.device("cpu"),
            checkpoints=CheckpointPolicy(Path(tmp), 10**9, 1),
        )
        trainer.setup(None)
        tracer = StepTracer(the_plan.mesh.coordinates(rank).pp, traced_steps(total, 0, total))
        for step in range(WARMUP):
            trainer.train_step(step)
        step = WARMUP
        for block in range(blocks):
            traced = block % 2 == 1
            attachment = attach_tracer(trainer, tracer) if traced else None
            for _ in range(block_steps):
                dist.barrier()
                started = time.perf_counter()
                if attachment is None:
                    trainer.train_step(step)
                else:
                    traced_step(trainer, step, tracer)
                durations["traced" if traced else "untraced"].append(time.perf_counter() - started)
                step += 1
            if attachment is not None:
                attachment.remove()
    records = [r.to_dict() for r in tracer.records]
    Path(out, f"rank{rank}.json").write_text(json.dumps({**durations, "records": records}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Measurement:
    untraced_s: list[float]  # step times of the slower rank, untraced blocks
    traced_s: list[float]
    records: list[TraceRecord]


def measure(the_plan: Plan, blocks: int, block_steps: int) -> Measurement:
    """Run the blocks on 2 processes; each step's time is the slower rank's."""
    with tempfile.TemporaryDirectory() as out:
        args = (_free_port(), the_plan.to_json(), blocks, block_steps, out)
        mp.spawn(_worker, args=args, nprocs=WORKERS, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORKERS)]
    slowest = {
        k: [max(times) for times in zip(*(r[k] for r in ranks), strict=True)]
        for k in ("untraced", "traced")
    }
    records = [TraceRecord.from_dict(x) for r in ranks for x in r["records"]]
    return Measurement(slowest["untraced"], slowest["traced"], records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40, help="untraced and traced in turn")
    parser.add_argument("--block-steps", type=int, default=1)
    parser.add_argument("--out", default=None, help="write trace.json, timeline.png here")
    args = parser.parse_args()
    the_plan = pipeline_plan(args.blocks * args.block_steps)
    result = measure(the_plan, args.blocks, args.block_steps)
    untraced, traced = statistics.median(result.untraced_s), statistics.median(result.traced_s)
    # Each traced step against the untraced step just before it: slow drifts of the
    # machine's load cancel.
    ratios = [t / u for u, t in zip(result.untraced_s, result.traced_s, strict=True)]
    schedule = the_plan.schedule.value
    print(f"plan: {the_plan.mesh}, {the_plan.num_microbatches} micro-batches, {schedule}")
    print(f"untraced: median step {1e3 * untraced:.1f} ms over {len(result.untraced_s)} steps")
    print(f"traced:   median step {1e3 * traced:.1f} ms over {len(result.traced_s)} steps")
    from unipar.cluster.calibrate import calibrated_cpu_cluster
    from unipar.viz.trace import predicted_run_timeline, write_trace

    last = max(r.step for r in result.records)
    predicted = predicted_run_timeline(
        job_facts(job(last + 1)).profile, the_plan, calibrated_cpu_cluster()
    )
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="unipar-trace-"))
    outputs = write_trace(
        out,
        result.records,
        pp=the_plan.mesh.pp,
        stages=the_plan.mesh.pp * the_plan.virtual_stages,
        predicted=predicted,
    )
    print(f"trace: {outputs.trace_json}, {outputs.timeline_png}")
    print(outputs.summary)
    spans = len(result.records) / len({(r.step, r.rank) for r in result.records})
    per_span = span_cost_s()
    estimate = spans * per_span / untraced
    print(
        f"tracer's own cost: {1e6 * per_span:.1f} us per span x {spans:.0f} spans per rank "
        f"and step = {100 * estimate:.3f}% of the untraced step"
    )
    print(
        f"RESULT trace_overhead={1 - 1 / statistics.median(ratios):.4f} "
        f"trace_overhead_estimate={estimate:.5f}"
    )


def span_cost_s(repeats: int = 20000) -> float:
    """Seconds one recorded span costs (enter, exit, record), in this process."""
    tracer = StepTracer(0, range(1))
    tracer.begin_step(0)
    started = time.perf_counter()
    for _ in range(repeats):
        with tracer.span(TracedAction.FORWARD, 0, 0):
            pass
    return (time.perf_counter() - started) / repeats


if __name__ == "__main__":
    main()
