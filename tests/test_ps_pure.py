"""Parameter-server planning pieces without Ray: partition, consistency, optimizer
math against torch's, the cost model's choice, and bad input."""

from __future__ import annotations

import pytest
import torch

from unipar.errors import ConfigError
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.plan.representation import GradSync
from unipar.plan.sync_cost import Links, SparseWorkload, choose_grad_sync
from unipar.ps.consistency import Consistency, ConsistencySpec, may_read
from unipar.ps.optim import ShardOptimizer
from unipar.ps.partition import RowSharding, TensorInfo, partition
from unipar.ps.worth import check_worth_serving

TENSORS = [
    TensorInfo("emb", (103, 4), embedding=True),
    TensorInfo("w1", (10, 10)),
    TensorInfo("w2", (50,)),
    TensorInfo("b", (3,)),
]


@pytest.mark.parametrize("sharding", list(RowSharding))
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_rows_are_placed_once_and_locate_inverts(sharding, k):
    parts = partition(TENSORS, k, sharding)
    ids = torch.arange(103)
    server, local = parts.locate("emb", ids)
    assert sum(parts.rows_on("emb", s) for s in range(k)) == 103
    for s in range(k):
        mine = local[server == s]
        assert sorted(mine.tolist()) == list(range(parts.rows_on("emb", s)))
        assert torch.equal(parts.global_ids("emb", s, mine), ids[server == s])
    assert sorted(parts.dense) == ["b", "w1", "w2"]


def test_dense_tensors_balance_largest_first():
    parts = partition([t for t in TENSORS if not t.embedding], 2)
    assert parts.dense["w1"] != parts.dense["w2"]  # the two big ones apart


def test_more_servers_than_things_to_place_is_an_error():
    with pytest.raises(ConfigError, match=r"more servers than parameters to place.*<= 3"):
        partition([t for t in TENSORS if not t.embedding], 4)
    with pytest.raises(ConfigError, match="at least 1"):
        partition(TENSORS, 0)


def test_staleness_below_zero_is_an_error():
    with pytest.raises(ConfigError, match=r"staleness bound must be >= 0.*staleness=-1"):
        ConsistencySpec(Consistency.SSP, staleness=-1)


def test_consistency_reads():
    bsp, ssp0 = ConsistencySpec(), ConsistencySpec(Consistency.SSP, 0)
    ssp2, asp = ConsistencySpec(Consistency.SSP, 2), ConsistencySpec(Consistency.ASP)
    for applied in range(6):
        for clock in range(1, 8):
            assert may_read(clock, applied, bsp) == may_read(clock, applied, ssp0)
            assert may_read(clock, applied, bsp) == (applied >= clock - 1)
            assert may_read(clock, applied, ssp2) == (applied >= clock - 3)
            assert may_read(clock, applied, asp)


@pytest.mark.parametrize("kind", list(OptimizerKind))
def test_shard_optimizer_matches_torch(kind):
    """The servers' update of a dense tensor is the torch optimizer the same spec builds."""
    spec = OptimizerSpec(kind, lr=0.1)
    p = torch.nn.Parameter(torch.randn(6, 3, generator=torch.Generator().manual_seed(0)))
    opt = spec.build([p])
    mine = p.detach().clone()
    shard = ShardOptimizer(spec, {"p": mine})
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(6, 3, generator=g)
        p.grad = grad.clone()
        opt.step()
        shard.step("p", mine, grad, None)
    torch.testing.assert_close(mine, p.detach(), rtol=1e-5, atol=1e-6)


def test_sparse_adam_rows_match_torch_sparse_adam():
    spec = OptimizerSpec(OptimizerKind.ADAM, lr=0.1)
    emb = torch.nn.Embedding(8, 3, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1, betas=spec.betas)
    mine = emb.weight.detach().clone()
    shard = ShardOptimizer(spec, {"e": mine})
    for ids in ([1, 2], [2, 5, 7], [0, 1]):
        idx = torch.tensor(ids)
        opt.zero_grad()
        emb(idx).pow(2).sum().backward()
        opt.step()
        shard.step("e", mine, 2 * mine[idx], idx)
    torch.testing.assert_close(mine, emb.weight.detach(), rtol=1e-5, atol=1e-6)


LINKS = Links(all_reduce_bw=1e9, worker_bw=1e9, server_bw=1e9, latency_s=1e-4)


def test_planner_picks_ps_for_few_touched_rows_and_all_reduce_for_many():
    def w(f):
        return SparseWorkload(10_000_000, 8, 10_000, f, workers=4, servers=2)

    sparse, dense = choose_grad_sync(w(0.001), LINKS), choose_grad_sync(w(1.0), LINKS)
    assert sparse.kind is GradSync.PARAMETER_SERVER and "parameter_server" in sparse.reason
    assert dense.kind is GradSync.ALL_REDUCE and "all_reduce" in dense.reason
    assert sparse.ps.bytes_per_worker < sparse.all_reduce.bytes_per_worker


def test_more_servers_and_staleness_make_ps_cheaper():
    def w(k, s):
        return SparseWorkload(10**6, 8, 0, 0.2, workers=8, servers=k, staleness=s, compute_s=0.05)

    one, four = choose_grad_sync(w(1, 0), LINKS), choose_grad_sync(w(4, 0), LINKS)
    assert four.ps.step_s < one.ps.step_s
    assert choose_grad_sync(w(4, 2), LINKS).ps.step_s < four.ps.step_s


def test_nothing_worth_serving():
    dense = [t for t in TENSORS if not t.embedding]
    with pytest.raises(ConfigError, match="needs embedding tables"):
        check_worth_serving(dense, serve_dense=False)
    with pytest.warns(UserWarning, match="nothing worth a parameter server"):
        check_worth_serving(dense, serve_dense=True)
    with pytest.raises(ConfigError, match="touched_fraction must be in"):
        SparseWorkload(10, 2, 0, 1.5, workers=2)


def test_a_restored_server_does_not_wait_for_a_worker_that_had_left(tmp_path):
    """BSP, 2 workers: worker 1 finished and left; the server is restored from its
    snapshot; worker 0's next clock is applied without waiting for worker 1."""
    from unipar.runtime.servers.server import ParameterServer, Push

    def server() -> ParameterServer:
        sgd = OptimizerSpec(OptimizerKind.SGD, lr=0.1)
        return ParameterServer(0, {"w": torch.zeros(3)}, set(), sgd,
                               ConsistencySpec(), 2, str(tmp_path / "server.pt"), 1)

    grad = Push(dense={"w": torch.ones(3)}, rows={})
    first = server()
    first.push(0, 1, grad)
    first.push(1, 1, grad)
    first.leave(1)
    first.push(0, 2, grad)
    assert first.applied == 2  # snapshot at clock 2
    restored = server()
    assert restored.restored_from == 2
    restored.push(0, 3, grad)
    assert restored.applied == 3
    torch.testing.assert_close(restored.state()["w"], torch.full((3,), -0.3))
