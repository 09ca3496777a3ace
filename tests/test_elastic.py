"""Elastic training on the session's Ray: a data-parallel gang loses a worker
(SIGKILL), goes on with the survivor, and grows back to two workers when the freed
CPU is free again, all without a disk checkpoint.

Losses equal an uninterrupted run within 1e-5 (relative): with one worker the same
micro-batches are computed (micro-batch size kept) and their gradients accumulated
instead of all-reduced, so only the order of a float sum differs. The uninterrupted run
is the plain single-process loop on the whole global batch (``single_process_losses``,
1 s), which two-worker runs of each plan here matched within 1.7e-6 over 250 steps
(dp, fsdp and pp measured; tests/test_parity_*.py hold every plan to it): a two-worker
reference run of the same plan cost 10-32 s more per test.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray.cloudpickle
import torch

from unipar import Callback, fit
from unipar.data.sampler import GlobalBatchSampler
from unipar.errors import UserCodeError
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.plan import Plan
from unipar.plan.representation import Mesh
from unipar.runtime.checkpoint import list_checkpoints
from unipar.runtime.elastic.formation import SURVIVOR_GRACE_S
from unipar.runtime.metrics import read_events
from unipar.testing import SlowRegression, mse_loss, single_process_losses

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 100
BATCH = 8

# Each sample's load, so that the steps a lone survivor runs outlast a joining worker's
# start: 0.4 s a step on one worker, 37 s for the 92 steps after the kill at step 8 (it
# was 250 steps of 6 ms samples: 12 s for dp, 24 s for fsdp's slower steps). Once the
# scenario is over (the worker lost and the gang whole again), ScenarioOver writes the
# dataset's ``fast_once`` file and the remaining steps run at their own speed.
SAMPLE_DELAY_S = 0.05
RUN_DELAY_S = 0.006  # the runs that wait for no joiner (a disk recovery, a free CPU)


def slow_mlp_job(
    steps: int = STEPS, sample_delay_s: float = SAMPLE_DELAY_S, fast_once: Path | None = None
) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(
        name="elastic-mlp",
        model=functools.partial(MLP, config),
        dataset=functools.partial(SlowRegression, 512, 16, 4, sample_delay_s,
                                  fast_once=str(fast_once) if fast_once else None),
        global_batch_size=BATCH,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-2),
        loss=mse_loss,
    )


class ScenarioOver(Callback):
    """Writes ``fast_once`` once ``resizes`` resizes are taken in (see ``SAMPLE_DELAY_S``)."""

    def __init__(self, fast_once: Path, resizes: int = 2) -> None:
        self.fast_once, self.resizes, self.seen = fast_once, resizes, 0

    def on_resize(self, event):  # type: ignore[no-untyped-def]
        self.seen += 1
        if self.seen == self.resizes:
            self.fast_once.touch()


class KillOnce(Callback):
    """SIGKILL worker ``rank`` once step ``at`` is recorded; note what the disk held."""

    def __init__(self, at: int, rank: int, checkpoints) -> None:  # type: ignore[no-untyped-def]
        self.at, self.rank, self.checkpoints = at, rank, checkpoints
        self.killed_at: int | None = None
        self.on_disk_at_kill: list = []
        self.resizes: list = []

    def on_step(self, metrics, workers):  # type: ignore[no-untyped-def]
        if self.killed_at is None and metrics.step >= self.at and len(workers) > self.rank:
            self.killed_at = metrics.step
            self.on_disk_at_kill = list_checkpoints(self.checkpoints)
            os.kill(workers[self.rank].pid, signal.SIGKILL)

    def on_resize(self, event):  # type: ignore[no-untyped-def]
        self.resizes.append(event)


def _check_samples(result, job: Job) -> None:
    """Every step once, each with exactly its global batch's samples. A step that a
    worker committed and then died before its report arrived is recorded from the
    survivors' reports only (``partial``): its samples are a part of the batch (the
    whole batch was consumed: the step's all-reduce completed on every rank)."""
    sampler = GlobalBatchSampler(512, job.global_batch_size, job.seed)
    assert [m.step for m in result.history] == list(range(job.steps))
    for metrics in result.history:
        expected = sorted(sampler.global_indices(metrics.step).tolist())
        if metrics.partial:
            assert set(metrics.sample_ids) < set(expected), f"step {metrics.step}"
        else:
            assert sorted(metrics.sample_ids) == expected, f"step {metrics.step}"
    assert sum(m.partial for m in result.history) <= len(result.resizes)


RUN = dict(checkpoint_every=10_000, progress=False)


@pytest.fixture(scope="module")
def reference_losses() -> list[float]:
    """The uninterrupted run's losses: the same samples, none of them slow to load."""
    losses, _ = single_process_losses(slow_mlp_job(sample_delay_s=0.0))
    return losses


def _assert_same_losses(result, reference: list[float]) -> None:  # type: ignore[no-untyped-def]
    """Equal losses, except on a ``partial`` step (see :func:`_check_samples`)."""
    whole = [i for i, m in enumerate(result.history) if not m.partial]
    torch.testing.assert_close(
        torch.tensor(result.losses)[whole],
        torch.tensor(reference)[whole],
        rtol=1e-5,
        atol=1e-7,
    )


def _run_shrink_and_grow(tmp_path, plan, reference, *, snapshot_every=None, most=2,  # type: ignore[no-untyped-def]
                         killed=1):
    """Rank ``killed`` of ``most`` workers killed at step 8: the gang shrinks to half (the
    least size the plan takes), then grows back when the resources are free again."""
    job = slow_mlp_job(fast_once=tmp_path / "scenario-over")
    run = dict(plan=plan, **RUN)
    killer = KillOnce(at=8, rank=killed, checkpoints=tmp_path / "elastic" / "checkpoints")
    half = most // 2
    result = fit(
        job,
        workers=(half, most),
        run_dir=tmp_path / "elastic",
        callbacks=[killer, ScenarioOver(tmp_path / "scenario-over")],
        snapshot_every=snapshot_every,
        **run,
    )
    assert killer.killed_at is not None
    # No checkpoint was on disk when the worker died: the state came from memory.
    assert killer.on_disk_at_kill == []
    sizes = [(e.old, e.new) for e in result.resizes]
    assert sizes[:2] == [(most, half), (half, most)], result.resizes
    assert "worker lost" in result.resizes[0].reason
    assert result.resizes[1].reason == "resources free"
    events = read_events(result.metrics_path)
    assert [(e["old"], e["new"]) for e in events][:2] == [(most, half), (half, most)]
    _check_samples(result, job)
    _assert_same_losses(result, reference)
    assert f"{most}\u2192{half} at step" in result.summary()
    return result


def test_data_parallel_shrinks_and_grows_live(ray_cluster, reference_losses, tmp_path):
    result = _run_shrink_and_grow(tmp_path, None, reference_losses)
    # Data parallel: the survivor's own state, no step lost.
    assert result.resizes[0].step >= 8


def test_an_adaptive_batch_job_grows_live_from_a_survivors_snapshot(
    ray_cluster, reference_losses, tmp_path
):
    """The joiner's state (its adaptive batch's with it) comes from a survivor's snapshot
    in memory; the adaptive step, which registers DDP's one communication hook, is built
    once (a second registration failed the joiner's formation). Batch pinned at M0 by
    its bound: the losses are the plain run's."""
    from unipar.job import AdaptiveBatch

    job = slow_mlp_job(fast_once=tmp_path / "scenario-over")
    job = replace(job, adaptive=AdaptiveBatch(max_global_batch=job.global_batch_size))
    killer = KillOnce(at=8, rank=1, checkpoints=tmp_path / "checkpoints")
    over = ScenarioOver(tmp_path / "scenario-over")
    result = fit(job, workers=(1, 2), run_dir=tmp_path, callbacks=[killer, over], **RUN)
    assert [(e.old, e.new) for e in result.resizes][:2] == [(2, 1), (1, 2)], result.resizes
    _assert_same_losses(result, reference_losses)


def test_fixed_size_recovers_live_with_a_replacement(ray_cluster, reference_losses, tmp_path):
    job = slow_mlp_job(fast_once=tmp_path / "scenario-over")
    killer = KillOnce(at=8, rank=0, checkpoints=tmp_path / "checkpoints")
    over = ScenarioOver(tmp_path / "scenario-over", resizes=1)  # one replacement
    result = fit(job, workers=2, run_dir=tmp_path, callbacks=[killer, over], **RUN)
    assert killer.killed_at is not None and killer.on_disk_at_kill == []
    assert [(e.old, e.new) for e in result.resizes] == [(2, 2)]
    assert result.failures == 1
    _check_samples(result, job)
    _assert_same_losses(result, reference_losses)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(mesh=Mesh(fsdp=2), microbatch_size=4),
        Plan(mesh=Mesh(pp=2), microbatch_size=2, num_microbatches=4, stage_boundaries=(2,)),
    ],
    ids=["fsdp", "pp"],
)
def test_sharded_plans_shrink_and_grow_from_memory(ray_cluster, reference_losses, tmp_path, plan):
    result = _run_shrink_and_grow(tmp_path, plan, reference_losses, snapshot_every=5)
    # Rolled back at most to the last snapshot: steps redone, same losses, same samples.
    assert result.resizes[0].step % 5 == 0


def test_an_hsdp_gang_shrinks_at_once_and_grows_back_to_its_first_mesh(
    ray_cluster, reference_losses, tmp_path
):
    """dp 2 x fsdp 2, then fsdp 2 alone, then dp 2 x fsdp 2 again: the survivors build a
    mesh equal to their first one, which DTensor's caches (keyed by mesh equality) must
    not answer with the first gang's process groups (they did: "Could not resolve the
    process group registered under the name 5" in the grown gang's formation)."""
    plan = Plan(mesh=Mesh(dp=2, fsdp=2), microbatch_size=2)
    result = _run_shrink_and_grow(tmp_path, plan, reference_losses, snapshot_every=5, most=4,
                                  killed=3)
    # every survivor left its step when the killed rank's peers cut their connections,
    # those of the mesh's groups included: none sat out the grace after which the
    # controller gives a survivor up (each did, 30 s, while only the world group's were)
    assert result.resizes[0].seconds < SURVIVOR_GRACE_S, result.resizes[0]


def test_a_job_the_workers_cannot_unpickle_names_the_cause(ray_cluster, tmp_path, monkeypatch):
    """A job whose model lives in a module only the driver can import: the workers'
    constructors raise, and the error names that (not a lack of resources)."""
    (tmp_path / "driver_only_models.py").write_text(
        "import torch\n\ndef model():\n    return torch.nn.Linear(16, 4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import driver_only_models  # type: ignore[import-not-found]

    job = replace(slow_mlp_job(2), model=driver_only_models.model)
    with pytest.raises(UserCodeError, match=r"No module named 'driver_only_models'.*py_modules"):
        fit(job, workers=(1, 2), run_dir=tmp_path / "run", progress=False)


def test_a_sharded_gang_resumes_from_a_disk_checkpoint_newer_than_its_snapshot(
    ray_cluster, tmp_path
):
    """FSDP, a snapshot every 10 steps and a disk checkpoint every 2: a worker killed after
    step 12 is recovered from the newest state (a checkpoint at 12 or later), not from the
    older snapshot at step 10. Every step is still run once with its own samples."""
    job = slow_mlp_job(40, RUN_DELAY_S)
    killer = KillOnce(at=12, rank=1, checkpoints=tmp_path / "checkpoints")
    result = fit(job, workers=(1, 2), run_dir=tmp_path, callbacks=[killer],
                 plan=Plan(mesh=Mesh(fsdp=2), microbatch_size=4), snapshot_every=10,
                 checkpoint_every=2, progress=False)
    assert killer.killed_at is not None
    assert "worker lost" in result.resizes[0].reason
    assert result.resizes[0].step >= 12, result.resizes
    _check_samples(result, job)


class SlowToBuildOnRank1(SlowRegression):
    """Rank 1 of a gang of two builds its dataset slowly, and leaves its process id in
    ``pid_file`` first: a window in which the gang is still forming."""

    def __init__(self, pid_file: str, fast_once: str) -> None:
        super().__init__(512, 16, 4, SAMPLE_DELAY_S, fast_once=fast_once)
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() == 2 and dist.get_rank() == 1:
            Path(pid_file).write_text(str(os.getpid()))
            time.sleep(3.0)


def _kill_once_it_appears(pid_file: Path) -> None:
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            return
        time.sleep(0.05)


def test_a_worker_lost_while_the_gang_forms_is_a_failure_not_the_end(
    ray_cluster, reference_losses, tmp_path
):
    """Rank 1 is SIGKILLed while the first gang forms: the run counts one failure, forms
    again with the survivor and grows back to two; every step once, the losses of the
    uninterrupted run. Before, the whole run failed."""
    import threading

    pid_file = tmp_path / "rank1.pid"
    over = ScenarioOver(tmp_path / "scenario-over")
    dataset = functools.partial(SlowToBuildOnRank1, str(pid_file), str(over.fast_once))
    job = replace(slow_mlp_job(), dataset=dataset)
    killer = threading.Thread(target=_kill_once_it_appears, args=(pid_file,), daemon=True)
    killer.start()
    result = fit(job, workers=(1, 2), run_dir=tmp_path, max_failures=1, callbacks=[over], **RUN)
    killer.join()
    assert result.failures == 1
    reasons = [e.reason for e in result.resizes]
    assert reasons[0] == "worker lost while the gang formed", result.resizes
    assert [(e.old, e.new) for e in result.resizes][:2] == [(2, 1), (1, 2)]
    _check_samples(result, job)
    _assert_same_losses(result, reference_losses)


class FreeCPUsAt(Callback):
    """Notes the cluster's free CPUs once step ``at`` is recorded."""

    def __init__(self, at: int) -> None:
        self.at, self.free, self.size = at, None, 0

    def on_step(self, metrics, workers):  # type: ignore[no-untyped-def]
        if metrics.step == self.at:
            self.free, self.size = ray.available_resources().get("CPU", 0.0), len(workers)


def test_a_gang_does_not_hold_a_cpu_it_cannot_grow_into(ray_cluster, tmp_path):
    """Batch 8 on a cluster with 3 CPUs free: the gang runs on 2 (3 does not divide the
    batch) and leaves the third CPU free, for other work, instead of starting a worker
    that could never join (it held the CPU for the whole run)."""

    @ray.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote())
    try:
        probe = FreeCPUsAt(60)
        result = fit(slow_mlp_job(80, RUN_DELAY_S), workers=(1, 4), run_dir=tmp_path,
                     callbacks=[probe], **RUN)
    finally:
        ray.kill(holder)
    assert len(result.history) == 80
    assert probe.size == 2  # (a gang that began on 1, while an earlier test's workers
    assert probe.free == 1.0  # were still going away, grew to 2 since)
