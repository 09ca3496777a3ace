"""The planner on the GPUs present: predicted against measured step time of each
strategy, and the corrections it learns from them.

A GPT (1024 wide, 8 blocks, 512 tokens, global batch 32) trains for ``--steps`` steps
under each strategy the GPUs allow, through ``fit`` on Ray with NCCL, one after another:
ddp, fsdp, tp, pp (2 GPUs or more) and a hybrid of tensor and data parallelism (4 or
more); on one GPU: ddp, then 4 micro-batches without and with recompute, then ddp again
(now predicted with what the runs before it taught). Each run's summary compares its
steady-state median step with the plan's prediction; each run leaves its record, so
every run after the first is planned and predicted with the corrections the runs before
it taught (as a user's runs are). At the end: the factors learned per cluster (``unipar
calibrate --show`` lists the records).

Never run in CI: it needs CUDA GPUs, and without one prints why and exits 0.
``--cpu`` runs the same on 2 CPU workers (gloo, a smaller GPT) to check the script on a
machine without a GPU.

    python benchmarks/gpu_check.py [--steps 60] [--cpu] [--trace 5] [--keep DIR]

``--trace N`` adds a last run of ddp with its last N steps traced, whose summary shows
measured against predicted per component (where the uncorrected first run's error
comes from); ``--keep DIR`` copies the run records, the traced run's trace and each
run's metrics there (no checkpoints: the GPU model's are 1.4 GB each).

Last line: ``RESULT gpus=N <strategy>_err=... ... learned_runs=N`` (errors: predicted /
measured - 1 of each run, corrected by the runs before it), or ``RESULT skipped=1``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from unipar.job import Job, OptimizerSpec
from unipar.models.gpt import GPT, GPTConfig
from unipar.plan import Constraints, Plan, Recompute, Strategy
from unipar.testing import RandomTokens

GPU_MODEL = GPTConfig(vocab_size=8192, seq_len=512, hidden=1024, layers=8, heads=16)
CPU_MODEL = GPTConfig(vocab_size=256, seq_len=128, hidden=128, layers=4, heads=4)
GLOBAL_BATCH = 32


def job(config: GPTConfig, steps: int) -> Job:
    return Job(
        name="gpu-check-gpt",
        model=functools.partial(GPT, config),
        dataset=functools.partial(RandomTokens, 4096, config.seq_len, config.vocab_size),
        global_batch_size=GLOBAL_BATCH,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-4),
    )


def strategies(devices: int, the_job: Job, gpu: bool) -> list[tuple[str, Plan | Strategy]]:
    """(name, plan or strategy) of each run the devices allow."""
    runs: list[tuple[str, Plan | Strategy]] = [("ddp", Strategy.DDP)]
    if devices == 1:
        recompute = Constraints(dp=1, microbatch_size=GLOBAL_BATCH // 4,
                                recompute=Recompute.FULL, runtime_only=True)
        micro = Constraints(dp=1, microbatch_size=GLOBAL_BATCH // 4,
                            recompute=Recompute.NONE, runtime_only=True)
        runs += [("mb4", _best(devices, the_job, gpu, micro)),
                 ("recompute_mb4", _best(devices, the_job, gpu, recompute)),
                 ("ddp_again", Strategy.DDP)]
    if devices >= 2:
        runs += [("fsdp", Strategy.FSDP), ("tp", Strategy.TP), ("pp", Strategy.PP)]
    if devices >= 4:
        hybrid = Constraints(tp=2, pp=1, fsdp=1, dp=devices // 2, runtime_only=True)
        runs.append(("hybrid", _best(devices, the_job, gpu, hybrid)))
    return runs


def _best(devices: int, the_job: Job, gpu: bool, fixed: Constraints) -> Plan:
    """The planner's best plan under ``fixed`` (e.g. tensor parallel pairs, data
    parallel across them)."""
    from unipar.cluster import cluster_preset
    from unipar.plan.for_job import job_facts
    from unipar.plan.report import plan

    cluster = cluster_preset("h100-80g" if gpu else "cpu", devices_per_node=devices)
    facts = job_facts(the_job)
    report = plan(facts.spec, cluster, GLOBAL_BATCH, constraints=fixed, profile=facts.profile)
    return report.best.plan


def _keep(runs: Path, keep: Path) -> None:
    """Copy the run records, each run's metrics and the traces into ``keep`` (flat)."""
    from unipar.cluster.run_records import records_dir

    keep.mkdir(parents=True, exist_ok=True)
    for path in records_dir().glob("*.jsonl"):
        shutil.copy(path, keep / path.name)
    for pattern in ("*/metrics.jsonl", "*/trace.json"):
        for path in runs.glob(pattern):
            shutil.copy(path, keep / f"{path.parent.name}_{path.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--cpu", action="store_true", help="2 CPU workers (checks the script)")
    parser.add_argument("--trace", type=int, default=0, metavar="N",
                        help="a last ddp run with its last N steps traced")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="copy the run records, traces and metrics here")
    args = parser.parse_args()
    gpu = not args.cpu
    if gpu and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: gpu_check skipped (--cpu checks the script)")
        print("RESULT skipped=1")
        return 0

    import ray

    from unipar.cluster.learned_fit import fit_factors
    from unipar.cluster.run_records import all_records
    from unipar.runtime.run import fit

    devices = torch.cuda.device_count() if gpu else 2
    the_job = job(GPU_MODEL if gpu else CPU_MODEL, args.steps)
    ray.init(
        num_cpus=max(2, devices) + 2,
        num_gpus=devices if gpu else 0,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    errors: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = strategies(devices, the_job, gpu)
            if args.trace:
                runs.append(("traced_ddp", Strategy.DDP))
            for name, plan in runs:
                traced = args.trace if name == "traced_ddp" else None
                result = fit(
                    the_job,
                    workers=devices,
                    plan=plan,
                    gpus_per_worker=1.0 if gpu else 0.0,
                    progress=False,
                    run_dir=Path(tmp) / name,
                    trace_steps=traced,
                )
                check = result.predictions[-1]
                print(f"\n== {name}: {check.plan}")
                lines = result.summary().splitlines()[1:]
                print("\n".join(lines if traced else lines[:4]), flush=True)
                if check.error is not None:
                    errors[name] = check.error
            if args.keep is not None:
                _keep(Path(tmp), args.keep)
    finally:
        ray.shutdown()
    learned = 0
    for records in all_records().values():
        fitted = fit_factors([r for r in records if r.job == the_job.name])
        if fitted.runs:
            learned = max(learned, fitted.runs)
            factors = ", ".join(f"{k.value} x{v:.2f}" for k, v in fitted.factors.items())
            print(f"\nlearned on {records[-1].cluster_label} from {fitted.runs} run(s): "
                  f"{factors}")
    shown = " ".join(f"{name}_err={error:+.3f}" for name, error in errors.items())
    print(f"RESULT gpus={devices if gpu else 0} {shown} learned_runs={learned}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
