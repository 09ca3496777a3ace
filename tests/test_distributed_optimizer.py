"""The distributed optimizer (ZeRO-1) shares parameters out so each rank's optimizer
state is about 1/n of the whole, and refuses plans it does not apply. No Ray: the
parity runs are in test_parity_plans (``*-distributed-optimizer``)."""

from __future__ import annotations

import pytest
import torch

from unipar.errors import UnsupportedPlanError
from unipar.models.gpt import GPT, GPTConfig
from unipar.plan import Mesh, Plan
from unipar.runtime.parallel.distributed_optimizer import (
    build_optimizer,
    check_distributed_optimizer,
    owners,
)


def test_each_rank_updates_about_a_quarter_of_the_parameters():
    model = GPT(GPTConfig(vocab_size=64, seq_len=16, hidden=32, layers=4, heads=2))
    params = list(model.parameters())
    owner = owners(params, 4)
    loads = [sum(p.numel() for p, o in zip(params, owner, strict=True) if o == r) for r in range(4)]
    total = sum(p.numel() for p in params)
    assert sum(loads) == total and max(loads) - min(loads) <= max(p.numel() for p in params)
    plan = Plan(mesh=Mesh(dp=4), distributed_optimizer=True)
    optimizers = [
        build_optimizer(torch.optim.Adam, model, plan, rank=r, world_size=4) for r in range(4)
    ]
    held = [sum(p.numel() for g in o.param_groups for p in g["params"]) for o in optimizers]
    assert held == loads


def test_refused_beside_sharded_tensor_or_pipeline_parallelism():
    with pytest.raises(UnsupportedPlanError, match=r"plain data parallelism only.*tp=2"):
        check_distributed_optimizer(Plan(mesh=Mesh(dp=2, tp=2), distributed_optimizer=True))
    check_distributed_optimizer(Plan(mesh=Mesh(dp=2, tp=2)))
