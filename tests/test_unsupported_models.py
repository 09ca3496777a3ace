"""A user's model that cannot take the requested strategy gets an error that says why
and which strategies remain; nothing is started or written."""

from __future__ import annotations

import sys

import pytest
import ray
import torch
from plans_for_tests import planned
from torch import nn

from unipar import ConfigError, UnsupportedPlanError, fit
from unipar.plan import Mesh, Plan, Strategy
from unipar.testing import UserModel, user_model_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TransformerOfTorchLayers(nn.Module):
    """Blocks are nn.TransformerEncoderLayer: attention with one fused in_proj weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).unsqueeze(1)
        for block in self.blocks:
            h = block(h)
        return self.head(h.squeeze(1))


class UnnamedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(self.norm(x))))


class UnnamedLinears(UserModel):
    """Blocks whose linear layers are named ``a`` and ``b``: their roles are unknown."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(UnnamedBlock() for _ in range(4))


class SkipAcrossBlocks(UserModel):
    """The head sees the embedding too: the forward is not a sequence of its layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        h = e
        for block in self.blocks:
            h = block(h)
        return self.head(h + e)


def single_linear() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 4))


def _fit(job, plan, tmp_path):  # type: ignore[no-untyped-def]
    return fit(job, workers=plan.mesh.world_size, plan=plan, run_dir=tmp_path, progress=False)


def test_fused_attention_cannot_take_tp(ray_cluster, tmp_path):
    job = user_model_job(model=TransformerOfTorchLayers)
    with pytest.raises(UnsupportedPlanError, match=r"nn.MultiheadAttention.*dp, fsdp and pp"):
        _fit(job, planned(job, 2, tp=2), tmp_path)
    assert not list(tmp_path.rglob("step_*"))


def test_linear_layers_of_unknown_role_cannot_take_tp(ray_cluster, tmp_path):
    job = user_model_job(model=UnnamedLinears)
    with pytest.raises(UnsupportedPlanError, match=r"'blocks\.0'.*\['a', 'b'\].*dp, fsdp and pp"):
        _fit(job, planned(job, 2, tp=2), tmp_path)


def test_model_without_blocks_cannot_take_pp(ray_cluster, tmp_path):
    job = user_model_job(model=single_linear)
    allowed = r"pp=2 for a model whose layers.*allow 1 stage.*dp, fsdp or tp"
    with pytest.raises(ConfigError, match=allowed):
        fit(job, workers=2, plan=Strategy.PP, run_dir=tmp_path, progress=False)
    by_hand = Plan(mesh=Mesh(pp=2), microbatch_size=4, num_microbatches=2, stage_boundaries=(1,))
    with pytest.raises(UnsupportedPlanError, match=r"has 1 layer\(s\).*dp, fsdp and tp"):
        _fit(job, by_hand, tmp_path)


def test_forward_that_is_not_a_sequence_cannot_take_pp(ray_cluster, tmp_path):
    job = user_model_job(model=SkipAcrossBlocks)
    skip = r"skip connection across the cut.*dp, fsdp and tp"
    with pytest.raises(UnsupportedPlanError, match=skip):
        _fit(job, planned(job, 2, pp=2, microbatch_size=2), tmp_path)
