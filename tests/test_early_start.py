"""Workers started before the job is loaded (``unipar train --address``): the gang trains
on them, with the losses of one process; a job they cannot load is named as a
constructor's would be; a plan on parameter servers asks for none, and servers the planner
picks stop them; those not taken are killed."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import ray
import torch
from ray.exceptions import RayActorError

from unipar import Callback
from unipar.errors import UserCodeError
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.plan import GradSync, Mesh, Plan
from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.early_start import EarlyStart
from unipar.runtime.preflight import preflight
from unipar.runtime.run import run
from unipar.testing import RandomRegression, mse_loss, single_process_losses

RTOL = 1e-5  # two replicas' all-reduced mean against one process's mean


def _job(steps: int = 6) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    return Job(name="early", model=functools.partial(MLP, config),
               dataset=functools.partial(RandomRegression, 256, 16, 4), global_batch_size=8,
               steps=steps, optimizer=OptimizerSpec(lr=1e-2), loss=mse_loss)


class _Pids(Callback):
    def __init__(self) -> None:
        self.pids: set[int] = set()

    def on_step(self, metrics, workers) -> None:  # type: ignore[no-untyped-def]
        self.pids.update(w.pid for w in workers)


def _pid(actor) -> int:  # type: ignore[no-untyped-def]
    return ray.get(actor.describe.remote(), timeout=120)[0]


def test_the_gang_trains_on_the_workers_started_before_the_job_was_loaded(ray_cluster,
                                                                          tmp_path):
    config = RunConfig(workers=2, run_dir=tmp_path, progress=False)
    early = EarlyStart(config)
    started = {_pid(actor) for actor in early.actors}
    assert len(started) == 2
    job = _job()
    seen = _Pids()
    result = run(preflight(job, config, callbacks=[seen]), early)
    assert seen.pids == started  # no other worker was started
    torch.testing.assert_close(result.losses, single_process_losses(job)[0], rtol=RTOL, atol=0)
    for actor in early.actors:  # the run's end stops them
        with pytest.raises(RayActorError):
            _pid(actor)


def test_a_job_the_early_workers_cannot_load_names_the_cause(ray_cluster, tmp_path,
                                                           monkeypatch):
    (tmp_path / "driver_only_early.py").write_text(
        "import torch\n\ndef model():\n    return torch.nn.Linear(16, 4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import driver_only_early  # type: ignore[import-not-found]

    job = replace(_job(), model=driver_only_early.model)
    config = RunConfig(workers=2, run_dir=tmp_path / "run", progress=False)
    early = EarlyStart(config)
    with pytest.raises(UserCodeError, match=r"the job could not be loaded: ModuleNotFoundError: "
                       r"No module named 'driver_only_early'.*py_modules"):
        run(preflight(job, config), early)


def test_servers_chosen_by_the_planner_stop_the_early_workers_and_train(ray_cluster,
                                                                        tmp_path):
    """``auto`` picks parameter servers (a dominant table) after the early workers were
    asked for: the servers' run takes none of them, trains as one process does, and
    they are gone when it ends."""
    from test_ps_fit import _assert_same_training, ctr_job

    job = ctr_job(rows=2_000_000)  # an all-reduce moves 32 MB a step, servers ~2 KB
    config = RunConfig(workers=2, plan="auto", run_dir=tmp_path, progress=False)
    early = EarlyStart(config)
    actors = early.actors
    assert len(actors) == 2
    result = run(preflight(job, config), early)
    assert result.plan.grad_sync is GradSync.PARAMETER_SERVER
    _assert_same_training(result, job)
    for actor in actors:
        with pytest.raises(RayActorError):
            _pid(actor)


def test_a_plan_on_parameter_servers_starts_no_early_workers(tmp_path):
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=4, grad_sync=GradSync.PARAMETER_SERVER)
    assert EarlyStart(RunConfig(workers=2, plan=plan, run_dir=tmp_path)).actors == ()


def test_workers_not_taken_are_killed(ray_cluster, tmp_path):
    early = EarlyStart(RunConfig(workers=2, run_dir=tmp_path, progress=False))
    actors = early.actors
    assert len(actors) == 2
    early.cancel()
    for actor in actors:
        with pytest.raises(RayActorError):
            _pid(actor)
