"""The shared cluster's scheduler sets an adaptive job's batch with its workers (Pollux §3):
the decision (pure), what the runner publishes and the store keeps (pure), the round that
sends the batch to the job's runner (the session's Ray, a stand-in runner: 1-2 s), and a
job under a scheduler that runs the batch it sets from the next step boundary with the
losses of the scale-invariant reference (a real runner and 2 workers: 13 s at a load
average of 3, 28 s at 10-12).
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import replace

import pytest
import ray.cloudpickle
import torch

from unipar.adapt import AdaptiveBatch
from unipar.adapt.chooser import choose
from unipar.adapt.config import LRRule
from unipar.adapt.noise import NoiseEstimate
from unipar.adapt.state import AdaptState, BatchShape
from unipar.data.sampler import SampleStream
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.sched.policies import PolicyName, make_policy
from unipar.service.decide import decided_batches, targets
from unipar.service.decide_batch import batch_observations
from unipar.service.state import JobRow, JobState, Store
from unipar.testing import SlowRegression, mse_loss

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _step_time(workers: int, micro: int, accum: int) -> float:
    """A step with a large fixed cost: bigger batches pay off until efficiency drops."""
    return 0.02 + 0.002 * micro * accum + 0.003 * (workers > 1)


def _adaptive_row(**fields) -> JobRow:  # type: ignore[no-untyped-def]
    shapes = {(4, m, 1): (20.0, 20 * _step_time(4, m, 1)) for m in (2, 4)}
    base = dict(id=1, name="a", user="u", priority=0, deadline=None, least=1, most=8,
                sizes=(1, 2, 4, 8), batch=8, steps=1000, state=JobState.RUNNING,
                submitted=1.0, started=1.0, target=4, workers=4, step=100, max_seen=4,
                step_times={4: (40.0, 40 * 0.03)}, max_batch=64, max_local=64,
                grad_sqr=1.0, grad_var=40.0, batch_times=shapes)
    return JobRow(**{**base, **fields})


def test_the_policy_sets_a_batch_that_differs_from_the_jobs_own_pick():
    """A (M0 8, up to 64) runs on 4 workers; B arrives and the goodput policy gives A 2.
    The batch it sets A there (goodput's best on 2 workers, from A's statistics and a
    throughput model fitted on the batches A ran) differs from the batch A's own chooser
    picks from the same numbers on the 4 workers it wants."""
    a = _adaptive_row()
    b = JobRow(id=2, name="b", user="u", priority=0, deadline=None, least=2, most=2,
               sizes=(2,), batch=8, steps=100, state=JobState.QUEUED, submitted=2.0)
    policy = make_policy(PolicyName.UNIPAR)
    assert targets(policy, [a], 4, 10.0, 1.0) == {1: 4}
    counts = targets(policy, [a, b], 4, 10.0, 1.0)
    assert counts == {1: 2, 2: 2}
    decided = decided_batches([a, b], counts, 10.0, 4)
    assert set(decided) == {1}  # B is a fixed batch
    own = choose(batch_observations(a), NoiseEstimate(0.9, a.grad_sqr, a.grad_var, 1.0),
                 init_batch=8, max_batch=64, replicas=4, max_local=64)
    assert 8 <= decided[1] <= 64 and decided[1] % 2 == 0
    assert decided[1] != own.global_batch
    # fewer workers, a smaller batch: each step's fixed cost is shared by fewer samples
    assert decided[1] < decided_batches([a], {1: 4}, 10.0, 4)[1]
    # before it reports its statistics, no batch is set: its own choice stands
    assert decided_batches([replace(a, grad_sqr=0.0)], counts, 10.0, 4) == {}


def test_the_runner_publishes_statistics_and_step_times_per_shape_and_the_store_keeps_them(
    tmp_path,
):
    from unipar.adapt.state import AdaptStats
    from unipar.runtime.metrics import StepMetrics
    from unipar.service.ledger import WARMUP_STEPS, RunnerStatus, StepLedger

    ledger = StepLedger(RunnerStatus(), batch=8)
    for i in range(6):
        micro = 2 if i < 3 else 4
        adapt = AdaptStats(4 * micro, 20.0, 1.0, 0.0, 1.0, float(i), None, 3.0, 60.0,
                           micro=micro, accum=1)
        ledger.step(StepMetrics(i, 1.0, 1e-3, 4 * micro, 0, 0.1 * micro, 0.0, 0, 100.0 + i,
                                adapt=adapt), size=4)
    status = ledger.status
    assert (status.grad_sqr, status.grad_var) == (3.0, 60.0)
    timed = 3 - WARMUP_STEPS  # the first steps of a gang are left out, as for step_times
    assert status.batch_times == {(4, 2, 1): pytest.approx((timed, 0.2 * timed)),
                                  (4, 4, 1): pytest.approx((3, 1.2))}
    store = Store(tmp_path / "s.sqlite")
    job = store.add(_adaptive_row(batch_times=None, grad_sqr=0.0, grad_var=0.0), b"job")
    store.update(job, grad_sqr=status.grad_sqr, grad_var=status.grad_var,
                 batch_times=status.batch_times, decided_batch=24)
    row = store.row(job)
    assert row.batch_times == status.batch_times and row.decided_batch == 24
    assert [o.local_bsz for o in batch_observations(row)] == [2.0, 4.0]


def test_a_held_batch_replaces_the_jobs_own_choices_with_the_same_rules():
    adaptive = AdaptiveBatch(max_global_batch=64, adapt_every=2, lr_rule=LRRule.SQRT)
    state = AdaptState.start(adaptive, 8, BatchShape(micro=4, accum=1, replicas=2))
    held = state.hold(24, adaptive, max_micro=32)
    assert held.shape == BatchShape(12, 1, 2) and held.held
    assert held.lr_factor(LRRule.SQRT) == pytest.approx(math.sqrt(3))
    assert state.hold(1000, adaptive, max_micro=8).shape.global_batch == 64  # its bound
    after = held.after_step(None, (held.shape, 0.1))
    assert not replace(after, since_choice=100).due(adaptive)  # no choice of its own
    assert AdaptState.from_dict(after.to_dict()).held  # kept in snapshots and checkpoints


class RecordingRunner:
    """A runner that reports an adaptive job's statistics and step times, and records
    the targets the scheduler sets."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def status(self):  # type: ignore[no-untyped-def]
        from unipar.service.ledger import RunnerStatus

        row = _adaptive_row()
        return RunnerStatus(step=100, workers=4, step_times=row.step_times, batch=8,
                            grad_sqr=row.grad_sqr, grad_var=row.grad_var,
                            batch_times=row.batch_times)

    def set_target(self, target: int, decided: float, resources=None, batch: int = 0):  # type: ignore[no-untyped-def]
        self.calls.append((target, batch))

    def recorded(self) -> list[tuple[int, int]]:
        return self.calls


def test_a_round_sends_the_batch_with_the_size_to_the_jobs_runner(ray_cluster, tmp_path):
    """The round reads the runner's statistics into the store, decides the size and the
    batch, and sets both on the runner; the store and the job's events keep the batch."""
    from unipar.service.scheduler import NAMESPACE, Scheduler

    scheduler = Scheduler(str(tmp_path), "unipar", 600.0)
    runner = None
    try:
        row = _adaptive_row(id=0, state=JobState.QUEUED, started=None, target=0, workers=0,
                            step=0, max_seen=0, step_times=None, grad_sqr=0.0, grad_var=0.0,
                            batch_times=None)
        blob = ray.cloudpickle.dumps((b"a pickled job", {}))
        name = f"unipar-job-{scheduler.token}-1"
        runner = ray.remote(RecordingRunner).options(
            name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0).remote()
        ray.get(runner.recorded.remote())
        job = scheduler.submit(row, blob)
        scheduler.store.update(job, max_seen=4)
        scheduler.round_now()  # starts it (adopting the runner made under its name)
        scheduler.round_now()  # reads its statistics; sets its size and batch
        ray.get(runner.recorded.remote())
        kept = scheduler.store.row(job)
        calls = ray.get(runner.recorded.remote())
        assert kept.grad_var == 40.0 and kept.batch_times
        assert kept.decided_batch > 0 and calls[-1] == (kept.target, kept.decided_batch)
        assert any("(goodput)" in text for _, text in scheduler.store.events(job))
    finally:
        scheduler._stop.set()
        scheduler._wake.set()
        if runner is not None:
            ray.kill(runner, no_restart=True)



def scale_invariant_losses(job: Job, batches: list[int], lrs: list[float]) -> list[float]:
    """The single-process losses of ``job`` run at these global batches and learning
    rates, each step's samples taken by position in the sample stream (the adaptive
    runtime's data order, :class:`~unipar.data.sampler.SampleStream`)."""
    torch.manual_seed(job.seed)
    model = job.model()
    optimizer = job.build_optimizer(model.parameters())
    dataset = job.dataset()
    stream, position, losses = SampleStream(len(dataset), job.seed), 0, []
    for batch, lr in zip(batches, lrs, strict=True):
        pairs = [dataset[int(i)] for i in stream.indices(position, batch)]
        position += batch
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = job.loss(model(torch.stack([p[0] for p in pairs])),
                        torch.stack([p[1] for p in pairs]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_an_adaptive_job_under_the_scheduler_runs_the_batch_it_sets(ray_cluster, tmp_path):
    """An adaptive job (M0 8, up to 64) submitted to a scheduler (in this process, rounds
    every 0.3 s, the unipar policy) on 2 workers: once its runner has published its
    statistics and step times, the scheduler sets its batch; the job's step reports show
    that it ran its own choices before and the scheduler's batches after (each one the
    scheduler decided, from its events), at AdamW's √S learning rate, and every step's
    loss is the single-process loss of the same samples by position at the same learning
    rate (rtol 1e-5, as the adaptive parity tests). 13-28 s: two process starts."""
    import time
    from pathlib import Path

    from unipar.runtime.metrics import read_metrics
    from unipar.service.client import adaptive_bounds
    from unipar.service.scheduler import Scheduler

    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    job = Job(
        name="held", model=functools.partial(MLP, config),
        dataset=functools.partial(SlowRegression, 256, 16, 4, 0.005, 3), global_batch_size=8,
        steps=40, optimizer=OptimizerSpec(lr=1e-2), loss=mse_loss, seed=3,
        adaptive=AdaptiveBatch(max_global_batch=64, lr_rule=LRRule.SQRT),
    )
    scheduler = Scheduler(str(tmp_path), "unipar", 600.0)
    try:
        row = JobRow(id=0, name=job.name, user="u", priority=0, deadline=None, least=2,
                     most=2, sizes=(2,), batch=8, steps=job.steps, state=JobState.QUEUED,
                     submitted=time.time(), **adaptive_bounds(job))
        blob = ray.cloudpickle.dumps((ray.cloudpickle.dumps(job), {"poll_interval_s": 0.1}))
        job_id = scheduler.submit(row, blob)
        began = time.monotonic()
        while not (kept := scheduler.store.row(job_id)).state.ended:
            assert time.monotonic() - began < 120, kept
            scheduler.round_now()
            time.sleep(0.3)
        events = [text for _, text in scheduler.store.events(job_id)]
    finally:
        scheduler.shutdown()
    assert kept.state is JobState.DONE, kept.error
    decided = {int(t.split(" -> ")[1].split()[0]) for t in events if t.endswith("(goodput)")}
    adapt = [r["adapt"] for r in read_metrics(Path(kept.run_dir) / "metrics.jsonl")]
    held = [a["global_batch"] for a in adapt if a["held"]]
    first = next(i for i, a in enumerate(adapt) if a["held"])
    assert first > 0 and all(a["held"] for a in adapt[first:])  # once set, it stays set
    assert held and set(held) <= decided, (held, decided)
    records = read_metrics(Path(kept.run_dir) / "metrics.jsonl")
    batches, lrs = [a["global_batch"] for a in adapt], [r["lr"] for r in records]
    assert lrs == pytest.approx([job.optimizer.lr * math.sqrt(b / 8) for b in batches])
    expected = scale_invariant_losses(job, batches, lrs)
    torch.testing.assert_close([r["loss"] for r in records], expected, rtol=1e-5, atol=0)
