"""The planner's choice between all-reduce and parameter servers (pure, no Ray)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from unipar.cluster.spec import PRESETS
from unipar.models import GPTConfig
from unipar.models.ctr import CTRModel, ctr_spec
from unipar.models.spec import ModelSpec
from unipar.plan import GradSync
from unipar.plan.grad_sync import SparseFacts, TableUse, sparse_facts, touched_fraction
from unipar.plan.report import plan
from unipar.plan.strategy_search import Constraints

CLUSTER = PRESETS["a100-80g"].resized(4)


def test_a_dominant_table_and_small_batches_get_servers_with_the_numbers():
    report = plan(ctr_spec(10_000_000, dim=16, fields=4), CLUSTER, 64)
    best = report.best
    assert best.plan.grad_sync is GradSync.PARAMETER_SERVER
    assert best.plan.mesh.world_size == best.plan.mesh.dp == 32
    assert not best.plan.distributed_optimizer  # the servers run the optimizer
    choice = report.grad_sync.choice
    assert choice.ps.step_s < choice.all_reduce.step_s
    assert best.estimate.time.grad_sync_s == pytest.approx(choice.ps.comm_s)
    assert report.grad_sync.servers == 4  # one per node
    text = report.explain()
    assert "gradients      parameter servers (4, one per node, BSP)" in text
    assert f"{choice.ps.step_s * 1e3:.1f} ms/step vs" in text
    assert report.to_dict()["plan"]["grad_sync"] == "parameter_server"


def test_a_large_batch_touching_many_rows_keeps_the_searched_plan():
    report = plan(ctr_spec(1_000_000, dim=16, fields=4), CLUSTER, 1 << 20)
    assert report.best.plan.grad_sync is GradSync.ALL_REDUCE
    assert report.best == report.result.best
    assert report.grad_sync.choice is not None  # priced, and lost
    assert report.grad_sync.touched_fraction > 0.1  # 32,768 samples x 4 ids per worker


@pytest.mark.parametrize("tied", [True, False])
def test_servers_are_not_considered_for_a_language_model(tied):
    spec = GPTConfig(
        vocab_size=512, seq_len=32, hidden=64, layers=2, heads=2, tie_embeddings=tied
    ).spec()
    report = plan(spec, CLUSTER, 64)
    assert report.best.plan.grad_sync is GradSync.ALL_REDUCE
    assert report.grad_sync.choice is None
    assert "parameter servers not considered: embedding tables hold" in report.explain()


def test_pinned_tensor_parallelism_rules_servers_out():
    report = plan(
        ctr_spec(10_000_000, dim=16, fields=4), CLUSTER, 64, constraints=Constraints(tp=2)
    )
    assert report.best.plan.grad_sync is GradSync.ALL_REDUCE
    assert "rule out" in report.grad_sync.why_not


def test_a_tied_table_counts_as_dense():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(1000, 8)
            self.out = torch.nn.Linear(8, 1000, bias=False)
            self.out.weight = self.embedding.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embedding(ids))

    facts = sparse_facts(ModelSpec("tied", Tied, (4,)))
    assert facts.tables == () and facts.dense_params == 8000


def test_ids_per_sample_are_counted_by_a_meta_forward():
    facts = sparse_facts(ModelSpec("ctr", functools.partial(CTRModel, 5000, 4, 3), (3,)))
    assert facts.tables == (TableUse("embedding", 5000, 4, 3.0),)


def test_touched_rows_are_the_expected_distinct_rows_of_uniform_ids():
    facts = SparseFacts((TableUse("t", 1000, 4, 2.0),), dense_params=10)
    n = 50 * 2  # ids one worker's batch of 50 looks up
    want = 1 - (1 - 1 / 1000) ** n
    assert touched_fraction(facts, 50) == pytest.approx(want, rel=1e-9)
    g = torch.Generator().manual_seed(0)
    drawn = [len(torch.randint(0, 1000, (n,), generator=g).unique()) / 1000 for _ in range(400)]
    assert sum(drawn) / len(drawn) == pytest.approx(want, rel=0.01)
    assert touched_fraction(facts, 10**6) == pytest.approx(1.0) and not math.isnan(want)
