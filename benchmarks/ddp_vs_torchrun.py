"""unipar's 2-worker data parallel vs plain ``torchrun --nproc_per_node=2`` DDP.

Both are launched from their command lines on the same job file (workload.py):
``torchrun --nproc_per_node=2 torchrun_ddp_baseline.py`` and
``unipar train workload.py --workers 2 --strategy PLAN.json`` (the plain data-parallel
plan, so no planning is timed). One invocation runs both, alternating,
``--repeats`` times each, on the same model, batch, data order and thread settings, and
prints per side:
  steady-state steps/s: the median interval between consecutive steps after ``--warmup``;
  time to first step: from launching the command to the end of step 0 on a worker.
unipar runs twice per repeat: cold (``unipar train`` starts its embedded Ray cluster) and
attached (``--address`` of a cluster already up, started by this script as ``unipar up``
or ``RAY_preload_python_modules=... ray start --head`` would: workers preload torch and
unipar's worker modules, ``unipar.ray_cluster.session.TRAINING_PRELOAD``).
Prints the ratios unipar / torchrun; last line
``RESULT steady=<steps/s ratio, attached> first_cold=<ratio> first_attached=<ratio>``
(targets: steady >= 0.99, first_cold <= 1.5, first_attached <= 1.0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RunTiming:
    steps_per_s: float
    first_step_s: float


PLAN_FILE = Path(tempfile.gettempdir()) / "unipar-ddp-vs-torchrun-plan.json"


def _step_ends(output: Path) -> list[float]:
    if output.suffix == ".json":  # the baseline's own record
        return json.loads(output.read_text())["step_ends"]
    return [json.loads(line)["finished_at"] for line in output.read_text().splitlines()]


def _timed_run(command: list[str], output_name: str, warmup: int) -> RunTiming:
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / output_name
        launched = time.time()
        done = subprocess.run(
            [arg.replace("{tmp}", tmp) for arg in command],
            cwd=HERE,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
        ends = _step_ends(output)
    intervals = [b - a for a, b in zip(ends[warmup:-1], ends[warmup + 1 :], strict=True)]
    return RunTiming(1.0 / statistics.median(intervals), ends[0] - launched)


def _write_data_parallel_plan(steps_job_batch: int) -> None:
    """The plan torchrun's side runs: plain data parallel over 2 workers."""
    from unipar.plan import Plan

    PLAN_FILE.write_text(Plan.data_parallel(2, steps_job_batch).to_json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    _write_data_parallel_plan(32)  # workload.py's global batch
    commands = {
        "torchrun": (
            [
                str(bin_dir / "torchrun"),
                "--nproc_per_node=2",
                "--standalone",
                "torchrun_ddp_baseline.py",
                str(args.steps),
                "{tmp}/timing.json",
            ],
            "timing.json",
        ),
        "unipar": (
            [
                str(bin_dir / "unipar"),
                "train",
                "workload.py",
                "--workers",
                "2",
                "--steps",
                str(args.steps),
                "--run-dir",
                "{tmp}/run",
                "--checkpoint-every",
                "1000000",
                "--no-progress",
                "--strategy",
                str(PLAN_FILE),
            ],
            "run/metrics.jsonl",
        ),
    }
    cluster = _start_cluster()
    attached = [*commands["unipar"][0], "--address", cluster]
    commands["attached"] = (attached, commands["unipar"][1])
    runs: dict[str, list[RunTiming]] = {name: [] for name in commands}
    for repeat in range(args.repeats):
        for name, (command, output_name) in commands.items():
            timing = _timed_run(command, output_name, args.warmup)
            runs[name].append(timing)
            print(
                f"repeat {repeat} {name:8s} steady {timing.steps_per_s:6.3f} steps/s   "
                f"first step after {timing.first_step_s:6.2f} s",
                flush=True,
            )
    summary = {
        name: RunTiming(
            statistics.median(t.steps_per_s for t in timings),
            statistics.median(t.first_step_s for t in timings),
        )
        for name, timings in runs.items()
    }
    base = summary["torchrun"]
    print(f"\n{'':10s}{'steady steps/s':>16s}{'first step (s)':>16s}")
    for name, timing in summary.items():
        print(f"{name:10s}{timing.steps_per_s:16.3f}{timing.first_step_s:16.2f}")
    ratios = {
        name: (t.steps_per_s / base.steps_per_s, t.first_step_s / base.first_step_s)
        for name, t in summary.items()
        if name != "torchrun"
    }
    for name, (steady, first) in ratios.items():
        print(f"{name + ' /':10s}{steady:16.3f}{first:16.2f}   (/ torchrun)")
    print(
        f"RESULT steady={ratios['attached'][0]:.3f} first_cold={ratios['unipar'][1]:.2f} "
        f"first_attached={ratios['attached'][1]:.2f}"
    )


def _start_cluster() -> str:
    """A local Ray cluster that outlives the runs (this process holds it; it ends with
    it), started as unipar starts its own (workers preloading ``TRAINING_PRELOAD``);
    returns its address for ``--address``."""
    import ray

    from unipar.ray_cluster.session import start_ray

    start_ray(None)
    time.sleep(5)  # its idle workers up, as on a cluster started earlier
    return ray.get_runtime_context().gcs_address


if __name__ == "__main__":
    main()
