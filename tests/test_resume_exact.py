"""Crash recovery in the restart mode (``elastic=False``): SIGKILL a worker process at a
random step after a checkpoint; the run finishes by itself and its final parameters equal
an uninterrupted run's, bit for bit.

Dropout is on, so the equality also proves each rank's RNG state was restored.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal

import pytest
import torch

from unipar import Callback, fit, load_model_state
from unipar.runtime.metrics import read_metrics
from unipar.testing import tiny_gpt_job

STEPS = 40
EVERY = 5
SEED = 20261123  # where the kill lands and which rank dies: the same on every run


class KillOneWorker(Callback):
    def __init__(self, at_step: int, rank: int) -> None:
        self.at_step, self.rank = at_step, rank
        self.killed_pid: int | None = None
        self.failures: list[int] = []

    def on_step(self, metrics, workers):
        if self.killed_pid is None and metrics.step >= self.at_step:
            self.killed_pid = workers[self.rank].pid
            os.kill(self.killed_pid, signal.SIGKILL)

    def on_failure(self, failure, attempt):
        self.failures.append(failure.rank)


def _job():
    # Bigger batches make each step last long enough for the kill to land mid-run.
    return tiny_gpt_job(steps=STEPS, global_batch_size=64, dataset_size=2048, dropout=0.1)


def test_killed_worker_resumes_bit_exact(ray_cluster, tmp_path, capfd):
    rng = random.Random(SEED)
    kill_at, rank = rng.randint(EVERY, 2 * EVERY + 3), rng.randint(0, 1)
    reference = fit(
        _job(), workers=2, run_dir=tmp_path / "clean", checkpoint_every=EVERY, progress=False
    )

    killer = KillOneWorker(kill_at, rank)
    crashed = fit(
        _job(),
        workers=2,
        run_dir=tmp_path / "crash",
        checkpoint_every=EVERY,
        progress=False,
        callbacks=[killer],
        elastic=False,
    )

    assert killer.killed_pid is not None, f"kill at step {kill_at} never happened"
    assert crashed.failures == 1 and killer.failures == [rank]
    # the whole gang restarted at its size, and said so; no resize
    note = r"worker rank \d was lost: .*; restarting from (checkpoint \S+|the start) \(failure 1 "
    assert re.search(note + r"of at most 3\)", capfd.readouterr().err, re.DOTALL)
    assert crashed.resizes == ()
    assert [m.step for m in crashed.history] == list(range(STEPS))
    # The restarted attempt resumed at a checkpoint boundary and trained to the end (steps
    # between that checkpoint and the kill, if any reported, appear once per attempt).
    records = [json.loads(line) for line in crashed.metrics_path.read_text().splitlines()]
    resumed = [r["step"] for r in records if r["attempt"] == 1]
    assert resumed and resumed[0] % EVERY == 0 and resumed[-1] == STEPS - 1
    assert resumed == list(range(resumed[0], STEPS))
    assert [r["step"] for r in read_metrics(crashed.metrics_path)] == list(range(STEPS))

    expected = load_model_state(reference.final_checkpoint)
    actual = load_model_state(crashed.final_checkpoint)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs (kill at {kill_at})"
    assert crashed.losses == reference.losses


@pytest.mark.parametrize("elastic", [False, True], ids=["restart", "elastic"])
def test_gives_up_after_max_failures(ray_cluster, tmp_path, elastic):
    from unipar import TrainingFailedError

    class KillEveryAttempt(Callback):
        def __init__(self):
            self.attempts_killed = set()

        def on_step(self, metrics, workers):
            if metrics.attempt not in self.attempts_killed:
                self.attempts_killed.add(metrics.attempt)
                os.kill(workers[0].pid, signal.SIGKILL)

    # Workers run ahead of the driver's reading of their reports; with many steps left,
    # the kill at an attempt's first report still lands before the run could end.
    long_job = tiny_gpt_job(steps=10 * STEPS, global_batch_size=64, dataset_size=2048)
    try:
        fit(
            long_job,
            workers=2,
            run_dir=tmp_path,
            max_failures=1,
            progress=False,
            callbacks=[KillEveryAttempt()],
            elastic=elastic,
        )
    except TrainingFailedError as error:
        assert "max_failures=1" in str(error)
    else:
        raise AssertionError("expected TrainingFailedError")
