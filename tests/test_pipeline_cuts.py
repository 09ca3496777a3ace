"""Pipeline stages of any sequence of layers, without Ray: where the planner may cut a
model, what tensor parallel splits of a BERT classifier, and the refusals, before any
worker starts, of models that cannot be cut, naming the layer and the reason (a skip
connection across a cut, which only real values show, is refused by the workers before
training: test_unsupported_models)."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import user_models
from plans_for_tests import planned
from torch import nn

from unipar import Job, UnsupportedPlanError
from unipar.analysis import LayerKind, layer_sequence
from unipar.model_call import ModelCall
from unipar.plan import TensorParallelStyle
from unipar.plan.for_job import job_facts
from unipar.runtime.config import RunConfig
from unipar.runtime.parallel import stages
from unipar.runtime.preflight import preflight
from unipar.testing import RandomRegression, mse_loss


def test_a_sequential_cnn_is_cut_between_layers_holding_parameters():
    job = user_models.sequential_cnn()
    profile = job_facts(job).profile
    assert profile.num_blocks == 0
    plan = planned(job, 4, pp=4, microbatch_size=2)
    holding = [i for i, layer in enumerate(profile.layers) if layer.params]
    assert set(plan.stage_boundaries) <= set(holding[1:])
    assert len(plan.stage_boundaries) == 3


def test_bert_embeddings_are_one_embedding_layer_replicated_under_tp():
    pytest.importorskip("transformers")
    job = user_models.bert_classifier()
    profile = job_facts(job).profile
    kinds = {layer.name: layer.kind for layer in profile.layers}
    assert kinds["bert.embeddings"] is LayerKind.EMBEDDING
    assert [k for k in kinds.values()].count(LayerKind.BLOCK) == 4
    styles = dict(zip(kinds, planned(job, 2, tp=2).layer_tp, strict=True))
    assert styles["bert.embeddings"] is TensorParallelStyle.REPLICATE
    assert styles["classifier"] is TensorParallelStyle.REPLICATE  # 2 classes: not worth it
    assert styles["bert.encoder.layer.0"] is TensorParallelStyle.MEGATRON


class Shared(nn.Module):
    """One block run twice: a stage boundary there would cut it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for _ in range(2):
            h = self.block(h)
        return self.head(h)


class PairBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h, g = pair
        return self.a(h) + g, self.b(g)


class Pairs(nn.Module):
    """Blocks passing a pair of tensors: a boundary would have to send a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(PairBlock() for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        pair = (h, h)
        for block in self.blocks:
            pair = block(pair)
        return self.head(pair[0])


def _chunks(model: nn.Module, *starts: str) -> list[list[str]]:
    names = [name for name, _ in layer_sequence(model)]
    bounds = [0, *(names.index(s) for s in starts), len(names)]
    return [names[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(
    ("model", "start", "says"),
    [
        (Shared, "block.1", r"layer 'block\.1' runs 2 times in one forward"),
        (Pairs, "blocks.1", r"layer 'blocks.1' takes a tuple as its first input"),
    ],
    ids=["layer-run-twice", "tuple-boundary"],
)
def test_a_cut_that_cannot_work_is_refused_on_meta_naming_the_layer(model, start, says):
    from unipar.analysis.meta import build_on_meta

    meta = build_on_meta(model)
    chunks = _chunks(meta, start)
    with pytest.raises(UnsupportedPlanError, match=says):
        stages.check_stages_compose(meta, chunks, torch.zeros(2, 16), ModelCall.POSITIONAL)


def test_a_model_that_cannot_be_cut_is_refused_before_any_worker_starts(tmp_path):
    job = Job(
        model=Pairs,
        dataset=functools.partial(RandomRegression, 64, 16, 4),
        global_batch_size=8,
        steps=1,
        loss=mse_loss,
    )
    plan = planned(job, 2, pp=2, microbatch_size=2)
    with pytest.raises(UnsupportedPlanError, match=r"layer 'blocks\.1' takes a tuple"):
        preflight(job, RunConfig(workers=2, plan=plan, run_dir=tmp_path / "run"))
