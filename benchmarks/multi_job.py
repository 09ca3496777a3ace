"""Four jobs on one shared 4-CPU cluster: FIFO at each job's requested size vs unipar's
scheduler (goodput policy, jobs resized live).

The same four MLP jobs (mixed requested sizes and lengths; each sample costs a few
milliseconds of data loading, so a job scales with its workers) arrive a few seconds
apart. (a) ``unipar up --policy fifo`` with each job's ``workers`` fixed at its
requested size: a job waits until its size is free. (b) ``unipar up --policy unipar``
with ``workers=1:4``: the scheduler shares the workers and resizes running jobs.
Job completion time (JCT) is from submission to the end (printed per job as time queued,
start-up until its first step began, and training to the end); makespan from the first
submission to the last end. Both runs use one local Ray instance, one after the other,
after one short unmeasured job (:func:`warm_up`).
Last line: ``RESULT avg_jct_ratio=<b/a> makespan_ratio=<b/a>``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.ray_cluster.session import start_ray
from unipar.runtime.metrics import read_metrics
from unipar.service import client
from unipar.service.state import JobState
from unipar.testing import SlowRegression, mse_loss

# (name, requested workers, steps, arrival second). Each job trains at its requested size
# at least as long as its start-up takes (two fresh Ray processes importing torch, 5-7 s
# here): with half these lengths the shortest jobs trained 4-7 s after a 5-8 s start-up,
# and the comparison was mostly one of process start-ups, which both policies pay alike.
JOBS = (("long-4", 4, 800, 0.0), ("short-1", 1, 120, 4.0), ("mid-2", 2, 300, 8.0),
        ("short-2", 2, 120, 12.0))


def make_job(name: str, steps: int, delay: float) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(name=name, model=functools.partial(MLP, config),
               dataset=functools.partial(SlowRegression, 512, 16, 4, delay), global_batch_size=8,
               steps=steps, optimizer=OptimizerSpec(lr=1e-2), loss=mse_loss)


def warm_up(state: Path, delay: float) -> None:
    """One short 4-worker job through a scheduler before either measured run.

    The first job of a fresh Ray instance pays its cold start (Ray's first worker
    processes, files read into the page cache): 5-11 s here against 5-7 s later. Without
    this the policy measured first would carry it alone.
    """
    client.up(state_dir=state, policy="fifo", interval_s=1.0)
    row = client.submit(make_job("warm-up", 5, delay), workers=(4, 4),
                        checkpoint_every=100_000).wait(timeout_s=600)
    client.down()
    if row.state is not JobState.DONE:
        raise SystemExit(f"the warm-up job ended {row.state.value}: {row.error}")


def run(policy: str, fixed: bool, state: Path, delay: float, scale: float) -> tuple[float, float]:
    """Average JCT and makespan (seconds) of the four jobs under ``policy``."""
    client.up(state_dir=state, policy=policy, interval_s=1.0)
    began = time.time()
    handles = []
    for name, size, steps, at in JOBS:
        time.sleep(max(0.0, began + at - time.time()))
        workers = (size, size) if fixed else (1, 4)
        handles.append(client.submit(make_job(name, int(steps * scale), delay),
                                     workers=workers, checkpoint_every=100_000))
    rows = [h.wait(timeout_s=1200) for h in handles]
    client.down()
    jct = [r.ended - r.submitted for r in rows]
    makespan = max(r.ended for r in rows) - min(r.submitted for r in rows)
    for r, t in zip(rows, jct, strict=True):
        steps = read_metrics(Path(r.run_dir) / "metrics.jsonl")
        first = steps[0]["finished_at"] - steps[0]["step_time_s"] if steps else r.ended
        print(f"  {policy:7s} {r.name:8s} {r.state.value:5s} JCT {t:6.1f} s = queued "
              f"{r.started - r.submitted:5.1f} + start-up {first - r.started:5.1f} + training "
              f"{r.ended - first:5.1f}; resizes {r.restarts}", flush=True)
    return statistics.mean(jct), makespan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per sample")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every job's steps")
    args = parser.parse_args()
    start_ray("local", num_cpus=4)
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(Path(tmp) / "warm-up", args.delay)
        fifo = run("fifo", True, Path(tmp) / "fifo", args.delay, args.scale)
        ours = run("unipar", False, Path(tmp) / "unipar", args.delay, args.scale)
    print(f"FIFO   avg JCT {fifo[0]:.1f} s  makespan {fifo[1]:.1f} s")
    print(f"unipar avg JCT {ours[0]:.1f} s  makespan {ours[1]:.1f} s")
    print(f"RESULT avg_jct_ratio={ours[0] / fifo[0]:.3f} makespan_ratio={ours[1] / fifo[1]:.3f}")


if __name__ == "__main__":
    main()
