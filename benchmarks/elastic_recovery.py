"""Recovery from a lost worker: unipar elastic vs unipar's restart mode vs Ray Train.

The scenario: an MLP trained data parallel on 2 workers, checkpoints every 5 steps; the
worker of rank 1 is SIGKILLed right after step 22 (it kills itself when it reads the
first sample of its share of step 23, so every side is killed at the same point). One
invocation runs, on one local Ray instance (4 logical CPUs):

- unipar elastic: ``fit(job, workers=(1, 2))``: the survivor goes on alone from its own
  memory, and the gang grows back to 2 when the freed CPU is free;
- unipar restart: ``fit(job, workers=2, elastic=False)``: the whole gang restarts from
  the newest disk checkpoint;
- Ray Train: ``TorchTrainer`` with ``FailureConfig(max_failures=3)``, a checkpoint
  reported every 5 steps, resuming from ``ray.train.get_checkpoint()``.

For each it prints the seconds from the kill to the next completed step and the
committed steps redone (steps <= 22 done again). Then the steady-state cost of the
in-memory snapshots that sharded state needs (replicated state needs none): the same
MLP under FSDP, mean steps/s with the default adaptive snapshots vs none, alternating
``--repeats`` times (median).
Last line: ``RESULT recovery_ratio=<unipar elastic / Ray Train> steps_lost=<unipar
elastic> snapshot_overhead=<1 - with/without>``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

from unipar import fit
from unipar.data.sampler import GlobalBatchSampler
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.plan import Plan
from unipar.plan.representation import Mesh
from unipar.testing import RandomRegression, mse_loss

KILL_AFTER = 22
EVERY = 5
BATCH = 256
DATASET = 32 * BATCH
SEED = 0
MODEL = MLPConfig(in_features=64, hidden=256, layers=4, out_features=8)


class KillingRegression(RandomRegression):
    """Regression data whose sample ``trigger`` kills the reading process, once (the
    time of the kill is written to ``marker`` first)."""

    def __init__(self, trigger: int, marker: str) -> None:
        super().__init__(DATASET, MODEL.in_features, MODEL.out_features)
        self.trigger, self.marker = trigger, marker

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        if index == self.trigger and not os.path.exists(self.marker):
            Path(self.marker).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def _trigger() -> int:
    """The first sample of rank 1's share of step KILL_AFTER + 1."""
    sampler = GlobalBatchSampler(DATASET, BATCH, SEED)
    return int(sampler.shard_indices(KILL_AFTER + 1, 1, 2)[0])


def _job(steps: int, marker: str) -> Job:
    return Job(
        name="elastic-recovery",
        model=functools.partial(MLP, MODEL),
        dataset=functools.partial(KillingRegression, _trigger(), marker),
        global_batch_size=BATCH,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
        loss=mse_loss,
        seed=SEED,
    )


def _recovery(step_ends: list[tuple[int, float]], killed_at: float) -> tuple[float, int]:
    """(seconds from the kill to the next completed step, committed steps redone).

    Steps up to KILL_AFTER were committed before the kill (a survivor may log the end of
    step 22 a moment after its peer died): only a second completion of one of them, or
    a step after them, counts as a step after the kill."""
    seen: set[int] = set()
    after, redone = [], set()
    for step, end in sorted(step_ends, key=lambda pair: pair[1]):
        if step > KILL_AFTER or step in seen:
            after.append(end)
            redone |= {step} & seen
        seen.add(step)
    return min(after) - killed_at, len(redone)


def _unipar(tmp: Path, steps: int, **options) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    marker = tmp / "killed"
    result = fit(
        _job(steps, str(marker)),
        run_dir=tmp / "run",
        checkpoint_every=EVERY,
        progress=False,
        **options,
    )
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    ends = [(r["step"], r["finished_at"]) for r in records if "event" not in r]
    for event in result.resizes:
        print(f"    resize {event} ({event.seconds:.2f} s to re-form)", flush=True)
    return _recovery(ends, float(marker.read_text()))


def _ray_train_loop(config: dict) -> None:  # type: ignore[type-arg]
    import ray.train
    import ray.train.torch
    from torch.utils.data import default_collate

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(SEED)
    model = ray.train.torch.prepare_model(MLP(MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    dataset = KillingRegression(_trigger(), config["marker"])
    sampler = GlobalBatchSampler(DATASET, BATCH, SEED)
    for step in range(start, config["steps"]):
        inputs, targets = default_collate(
            [dataset[int(i)] for i in sampler.shard_indices(step, rank, world)]
        )
        loss = mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done = step + 1
        if rank == 0:
            with open(config["log"], "a") as log:
                log.write(f"{step} {time.time()}\n")
        if done % EVERY == 0:
            with tempfile.TemporaryDirectory() as directory:
                saved = None
                if rank == 0:
                    state = {
                        "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "step": done,
                    }
                    torch.save(state, Path(directory) / "state.pt")
                    saved = ray.train.Checkpoint.from_directory(directory)
                ray.train.report({"step": done}, checkpoint=saved)


def _ray_train(tmp: Path, steps: int) -> tuple[float, int]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marker, log = tmp / "killed", tmp / "steps.log"
    trainer = TorchTrainer(
        _ray_train_loop,
        train_loop_config={"marker": str(marker), "log": str(log), "steps": steps},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            storage_path=str(tmp / "ray_train"),
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    trainer.fit()
    ends = [(int(s), float(t)) for s, t in (line.split() for line in log.read_text().splitlines())]
    return _recovery(ends, float(marker.read_text()))


def _steady_steps_per_s(tmp: Path, steps: int, warmup: int, snapshots: bool) -> float:
    """Mean steps/s after ``warmup`` of the MLP under FSDP (sharded state: the case that
    needs snapshots), with the default adaptive snapshots or none. The kill marker
    exists beforehand, so no worker kills itself."""
    marker = tmp / "already-killed"
    marker.touch()
    result = fit(
        _job(steps, str(marker)),
        workers=2,
        plan=Plan(mesh=Mesh(fsdp=2), microbatch_size=BATCH // 2),
        run_dir=tmp / f"steady-{snapshots}-{time.monotonic_ns()}",
        checkpoint_every=10**9,
        progress=False,
        snapshot_every=None if snapshots else 0,
    )
    ends = [m.finished_at for m in result.history][warmup:]
    return (len(ends) - 1) / (ends[-1] - ends[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--steady-steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        logging_level="ERROR",
        _system_config={"worker_niceness": 0},  # as unipar's own local Ray
    )
    # Processes that Ray Train starts and that look for "the" cluster (its placement
    # group cleaner) find this one, not another on the same machine.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    sides = {
        "unipar elastic": lambda tmp: _unipar(tmp, args.steps, workers=(1, 2)),
        "unipar restart": lambda tmp: _unipar(tmp, args.steps, workers=2, elastic=False),
        "ray train": lambda tmp: _ray_train(tmp, args.steps),
    }
    recovery: dict[str, tuple[float, int]] = {}
    for name, run in sides.items():
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{name}: ...", flush=True)
            recovery[name] = run(Path(tmp))
        seconds, redone = recovery[name]
        print(f"{name:16s} kill -> next step {seconds:6.2f} s   steps redone {redone}", flush=True)

    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for snapshots in rates:
                rate = _steady_steps_per_s(Path(tmp), args.steady_steps, args.warmup, snapshots)
                rates[snapshots].append(rate)
                print(f"steady fsdp, snapshots={snapshots}: {rate:.2f} steps/s", flush=True)
    without = statistics.median(rates[False])
    with_snapshots = statistics.median(rates[True])
    overhead = 1.0 - with_snapshots / without  # below 0: the noise is larger than it
    ratio = recovery["unipar elastic"][0] / recovery["ray train"][0]
    print(
        f"\nrecovery (unipar elastic / Ray Train) {ratio:.3f} (target <= 0.15); "
        f"restart mode / Ray Train {recovery['unipar restart'][0] / recovery['ray train'][0]:.3f}"
    )
    print(
        f"fsdp with adaptive snapshots: {with_snapshots:.2f} vs {without:.2f} steps/s without "
        f"(overhead {overhead:.3f}, target <= 0.03)"
    )
    ray.shutdown()
    print(
        f"RESULT recovery_ratio={ratio:.3f} steps_lost={recovery['unipar elastic'][1]} "
        f"snapshot_overhead={overhead:.3f}"
    )


if __name__ == "__main__":
    main()
