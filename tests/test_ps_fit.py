"""``fit`` runs a parameter-server plan (chosen by the planner for a model whose
embedding table dominates) and reproduces one process's training on the same global
batches: losses within 1e-5 relative, final weights within 1e-5."""

from __future__ import annotations

import functools
import sys

import pytest
import ray
import torch
from torch.utils.data import TensorDataset, default_collate

from unipar import Job, fit
from unipar.data.sampler import GlobalBatchSampler
from unipar.errors import ConfigError
from unipar.models.ctr import CTRModel
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.plan import GradSync, Mesh, Plan

ROWS, FIELDS, BATCH, STEPS, LR = 20_000, 4, 16, 5, 0.5
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job runs remotely


def clicks(rows: int = ROWS) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, rows, (256, FIELDS), generator=g)
    return TensorDataset(ids, (torch.sin(ids.sum(1).double()) > 0).float())


def bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(outputs, targets)


def ctr_job(rows: int = ROWS, **changes) -> Job:
    fields = {
        "model": functools.partial(CTRModel, rows, 4, FIELDS, 8),
        "dataset": functools.partial(clicks, rows),
        "global_batch_size": BATCH,
        "steps": STEPS,
        "loss": bce,
        "optimizer": OptimizerSpec(OptimizerKind.SGD, lr=LR),
        "seed": 3,
        "name": "ctr",
    }
    return Job(**(fields | changes))


def one_process(job: Job) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(job.seed)
    model = job.model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = job.dataset()
    sampler = GlobalBatchSampler(len(data), job.global_batch_size, job.seed)
    losses = []
    for step in range(job.steps):
        inputs, targets = default_collate([data[int(i)] for i in sampler.global_indices(step)])
        opt.zero_grad()
        loss = job.loss(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.state_dict().items()}


def _assert_same_training(result, job: Job) -> None:
    want_losses, want = one_process(job)
    assert result.losses == pytest.approx(want_losses, rel=1e-5)
    got = torch.load(result.final_checkpoint, weights_only=True)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-5)


def test_parameter_server_plan_equals_one_process(ray_cluster, tmp_path):
    job = ctr_job()
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=BATCH // 2, grad_sync=GradSync.PARAMETER_SERVER)
    result = fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False)
    assert result.plan.grad_sync is GradSync.PARAMETER_SERVER
    assert [m.step for m in result.history] == list(range(STEPS))
    _assert_same_training(result, job)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == STEPS


MARKED = GlobalBatchSampler(256, BATCH, 3).shard_indices(1, 0, 2)[0]  # step 1, rank 0


def marked_clicks() -> TensorDataset:
    """``clicks`` with one sample's target set to -1: only rank 0 meets it, at step 1."""
    ids, targets = clicks().tensors
    targets = targets.clone()
    targets[MARKED] = -1.0
    return TensorDataset(ids, targets)


def picky_bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if (targets < 0).any():
        raise ValueError("a target below 0 reached the loss")
    return bce(outputs, targets)


def test_a_worker_failing_mid_run_stops_the_run_with_its_error(ray_cluster, tmp_path):
    """Rank 0 fails at step 1 while rank 1 goes on to wait for it at the next clock's
    barrier: fit raises rank 0's error (it used to wait forever) and stops the run."""
    job = ctr_job(dataset=marked_clicks, loss=picky_bce)
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=BATCH // 2, grad_sync=GradSync.PARAMETER_SERVER)
    with pytest.raises(ValueError, match="a target below 0 reached the loss"):
        fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False)


def test_the_planner_chooses_servers_for_a_dominant_table_and_fit_runs_them(
    ray_cluster, tmp_path, capsys
):
    job = ctr_job(rows=2_000_000)  # an all-reduce moves 32 MB a step, servers ~2 KB
    result = fit(job, workers=2, plan="auto", run_dir=tmp_path, progress=False)
    assert result.plan.grad_sync is GradSync.PARAMETER_SERVER
    assert "gradients      parameter servers" in result.explanation
    assert "gradients      parameter servers" in capsys.readouterr().out
    _assert_same_training(result, job)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"optimizer": OptimizerSpec(OptimizerKind.SGD, lr=0.1, momentum=0.9)}, "momentum=0.9"),
        ({"optimizer": OptimizerSpec(OptimizerKind.ADAMW, weight_decay=0.1)}, "weight_decay=0.1"),
        ({"grad_clip_norm": 1.0}, "grad_clip_norm=1.0"),
    ],
)
def test_a_job_the_servers_cannot_run_is_refused_before_ray(changes, pattern, tmp_path):
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=BATCH // 2, grad_sync=GradSync.PARAMETER_SERVER)
    with pytest.raises(ConfigError, match=pattern):
        fit(ctr_job(**changes), workers=2, plan=plan, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("options", "pattern"),
    [({"trace_steps": 2}, "takes no trace_steps"), ({"resume": True}, "takes no resume")],
)
def test_run_options_the_servers_lack_are_refused_before_ray(options, pattern, tmp_path):
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=BATCH // 2, grad_sync=GradSync.PARAMETER_SERVER)
    with pytest.raises(ConfigError, match=pattern):
        fit(ctr_job(), workers=2, plan=plan, run_dir=tmp_path / "run", **options)


def test_auto_keeps_all_reduce_for_a_job_the_servers_cannot_run(ray_cluster, tmp_path):
    momentum = OptimizerSpec(OptimizerKind.SGD, lr=0.1, momentum=0.9)
    job = ctr_job(rows=2_000_000, optimizer=momentum, steps=2)
    result = fit(job, workers=2, plan="auto", run_dir=tmp_path, progress=False)
    assert result.plan.grad_sync is GradSync.ALL_REDUCE
    assert result.plan.mesh.world_size == 2  # (tp=2 too: the 1-wide head stays replicated)
    assert len(result.history) == 2
