"""unipar's 2-worker data parallel vs plain ``torchrun --nproc_per_node=2`` DDP.

Both are launched from their command lines on the same job file (workload.py):
``torchrun --nproc_per_node=2 torchrun_ddp_baseline.py`` and
``unipar train workload.py --workers 2 --strategy PLAN.json`` (the plain data-parallel
plan, so no planning is timed), on the same model, batch, data order, optimizer, schedule,
clipping and thread settings. unipar runs three ways:

- cold: ``unipar train`` starts its embedded Ray cluster (Ray's start is timed);
- attached, stock: ``--address`` of a cluster started just before as a user starts one,
  ``ray start --head`` with nothing else set (its worker processes import only Ray);
- attached, preloaded: the same, with ``RAY_preload_python_modules`` set to unipar's
  ``TRAINING_PRELOAD`` (torch, DCP, unipar's worker): what ``unipar up`` does.

An attached side's cluster is started before and stopped after its own run, and idles 5 s
before it (no other side runs beside an idle cluster). Sides alternate (the order rotated
each repeat) over ``--repeats``. Per side: steady-state steps/s (the median interval between
consecutive steps after ``--warmup``) and time to first step (from launching the command to
the end of step 0 on a worker). Correctness: every unipar run's per-step losses equal
torchrun's (the mean over both ranks; rtol ``LOSS_RTOL``).

RESULT: steady (steps/s, attached stock / torchrun; target >= 0.99), first_cold,
first_attached (stock cluster; target <= 1.0), first_attached_preloaded, each with
_min/_max over the repeats; loss_diff (the largest relative loss difference).
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

from measure import (
    Spread,
    Verdict,
    add_common_arguments,
    alternate,
    max_relative_difference,
    paired_ratios,
    repeats_of,
)
from ray_head import ray_head

HERE = Path(__file__).resolve().parent
PLAN_FILE = Path(tempfile.gettempdir()) / "unipar-ddp-vs-torchrun-plan.json"
LOSS_RTOL = 1e-4
IDLE_S = 5.0  # an attached side's cluster idles this long before its run


@dataclass(frozen=True)
class RunTiming:
    steps_per_s: float
    first_step_s: float
    losses: tuple[float, ...]


# -- the arithmetic (pure) ---------------------------------------------------------------


def timing(ends: list[float], losses: list[float], launched: float, warmup: int) -> RunTiming:
    """Steady steps/s (1 / the median interval after ``warmup`` steps) and seconds from
    launch to the end of step 0; NaN where there are too few steps."""
    intervals = [b - a for a, b in zip(ends[warmup:-1], ends[warmup + 1 :], strict=True)]
    rate = 1.0 / statistics.median(intervals) if intervals else float("nan")
    first = ends[0] - launched if ends else float("nan")
    return RunTiming(rate, first, tuple(losses))


def read_run(output: Path) -> tuple[list[float], list[float]]:
    """(step ends, losses) of a run's record: the baseline's JSON or unipar's metrics."""
    if output.suffix == ".json":
        record = json.loads(output.read_text())
        return record["step_ends"], record["losses"]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    rows = [r for r in rows if "event" not in r]
    return [r["finished_at"] for r in rows], [r["loss"] for r in rows]


# -- the runs ----------------------------------------------------------------------------


def timed_run(command: list[str], output_name: str, warmup: int) -> RunTiming:
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / output_name
        launched = time.time()
        done = subprocess.run([arg.replace("{tmp}", tmp) for arg in command], cwd=HERE,
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
        ends, losses = read_run(output)
    return timing(ends, losses, launched, warmup)


def attached(command: list[str], output_name: str, warmup: int, preload: tuple[str, ...]
             ) -> RunTiming:
    """``command`` with ``--address`` of a cluster started for it (and stopped after)."""
    with ray_head(num_cpus=2, preload=preload) as address:
        time.sleep(IDLE_S)  # its idle workers up, as on a cluster started earlier
        return timed_run([*command, "--address", address], output_name, warmup)


def main() -> int:
    from unipar.plan import Plan
    from unipar.ray_cluster.session import TRAINING_PRELOAD

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    steps = args.steps or (25 if args.quick else 60)
    bin_dir = Path(sys.executable).parent
    PLAN_FILE.write_text(Plan.data_parallel(2, 32).to_json())  # workload.py's global batch
    torchrun = [str(bin_dir / "torchrun"), "--nproc_per_node=2", "--standalone",
                "torchrun_ddp_baseline.py", str(steps), "{tmp}/timing.json"]
    unipar = [str(bin_dir / "unipar"), "train", "workload.py", "--workers", "2", "--steps",
              str(steps), "--run-dir", "{tmp}/run", "--checkpoint-every", "1000000",
              "--no-progress", "--strategy", str(PLAN_FILE)]
    metrics = "run/metrics.jsonl"
    runs = alternate(
        {
            "torchrun": lambda: timed_run(torchrun, "timing.json", args.warmup),
            "cold": lambda: timed_run(unipar, metrics, args.warmup),
            "stock": lambda: attached(unipar, metrics, args.warmup, ()),
            "preloaded": lambda: attached(unipar, metrics, args.warmup, TRAINING_PRELOAD),
        },
        repeats,
        log=lambda line: print(line, flush=True),
    )
    return report(runs, quick=args.quick)


def report(runs: dict[str, list[RunTiming | None]], *, quick: bool) -> int:
    verdict = Verdict(quick=quick)

    def values(name: str, field: str) -> list[float | None]:
        return [None if t is None else getattr(t, field) for t in runs[name]]

    print(f"\n{'':12s}{'steady steps/s':>30s}{'first step (s)':>30s}")
    for name in runs:
        print(f"{name:12s}{Spread.of(values(name, 'steps_per_s'))!s:>30s}"
              f"{Spread.of(values(name, 'first_step_s'))!s:>30s}")
    reference = runs["torchrun"]
    worst = 0.0
    for name in ("cold", "stock", "preloaded"):
        diffs = [max_relative_difference(t.losses, r.losses) if t and r else float("inf")
                 for t, r in zip(runs[name], reference, strict=True)]
        worst = max([worst, *diffs])
        verdict.check(all(d <= LOSS_RTOL for d in diffs),
                      f"unipar {name}: per-step losses equal torchrun's (max rel. diff "
                      f"{max(diffs):.1e})")

    def versus(name: str, field: str) -> Spread:
        return Spread.of(paired_ratios(values(name, field), values("torchrun", field)))

    steady = versus("stock", "steps_per_s")
    first_attached = versus("stock", "first_step_s")
    print("(unipar / torchrun: stock = a plain `ray start --head` cluster; preloaded = one "
          "whose workers import torch and unipar's worker as they start)")
    verdict.target("steady", steady, 0.99, at_most=False)
    verdict.target("first_attached", first_attached, 1.0)
    return verdict.finish({
        "steady": steady,
        "first_cold": versus("cold", "first_step_s"),
        "first_attached": first_attached,
        "first_attached_preloaded": versus("preloaded", "first_step_s"),
        "loss_diff": f"{worst:.1e}",
    })


if __name__ == "__main__":
    sys.exit(main())
