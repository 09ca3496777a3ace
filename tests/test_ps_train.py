"""Parameter servers on the session Ray: synchronous PS equals one process, SSP with
s=0 equals BSP, dense all-reduce mixed with served embeddings, and a server killed
with SIGKILL mid-run is restored from its snapshot."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
import time

import pytest
import torch

from unipar.errors import ConfigError
from unipar.models.ctr import CTRModel, ZipfClicks, ctr_loss
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.ps.consistency import Consistency, ConsistencySpec
from unipar.ps.partition import RowSharding
from unipar.runtime.servers.train import PSConfig, PSRun, train

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # GatedCTR, in workers

ROWS, WORKERS, STEPS = 300, 2, 4
TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32 sums in another order


factory = functools.partial(CTRModel, ROWS, dim=4, fields=3, hidden=8, seed=0)


class GatedCTR(CTRModel):
    """A dense layer runs before the table: its tensors must be pulled before the rows."""

    def __init__(self) -> None:
        super().__init__(ROWS, dim=4, fields=3, hidden=8, seed=0)
        self.gate = torch.nn.Linear(1, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gate(torch.ones(1, 1)))
        return self.mlp(self.embedding(ids).flatten(1) * gate).squeeze(-1)


DATA = ZipfClicks(ROWS, batch=16, fields=3, distinct=ROWS)


def single_process(kind: OptimizerKind, lr: float, make=factory):
    """The same steps in one process on the global batch (both workers' batches)."""
    model = make()
    model.embedding.sparse = True
    dense = [p for n, p in model.named_parameters() if not n.startswith("embedding")]
    if kind is OptimizerKind.ADAM:
        betas = OptimizerSpec(kind).betas
        opts = [
            torch.optim.SparseAdam([model.embedding.weight], lr=lr, betas=betas),
            torch.optim.Adam(dense, lr=lr, betas=betas),
        ]
    else:
        opts = [torch.optim.SGD(model.parameters(), lr=lr)]
    losses = []
    for clock in range(1, STEPS + 1):
        batches = [DATA(w, clock) for w in range(WORKERS)]
        batch = tuple(torch.cat(parts) for parts in zip(*batches, strict=True))
        for o in opts:
            o.zero_grad()
        loss = ctr_loss(model, batch)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def run(config: PSConfig, make=factory):
    return train(make, DATA, ctr_loss, workers=WORKERS, steps=STEPS, config=config)


@pytest.mark.parametrize(
    ("kind", "servers", "sharding", "serve_dense"),
    [
        (OptimizerKind.ADAM, 2, RowSharding.HASH, True),
        (OptimizerKind.SGD, 3, RowSharding.RANGE, False),
    ],
)
def test_synchronous_ps_equals_one_process(ray_cluster, kind, servers, sharding, serve_dense):
    lr = 0.05
    want_losses, want = single_process(kind, lr)
    config = PSConfig(servers, sharding, OptimizerSpec(kind, lr=lr), serve_dense=serve_dense)
    got = run(config)
    mean = [sum(ls) / WORKERS for ls in zip(*got.losses, strict=True)]
    assert mean == pytest.approx(want_losses, rel=1e-5)
    for name, value in want.items():
        torch.testing.assert_close(got.params[name], value, **TOL)
    assert got.bytes_pulled > 0 and got.bytes_pushed > 0


def test_dense_layer_before_the_table_reads_this_clocks_values(ray_cluster):
    """The gate runs before the lookup, so its tensors come in a pull of their own; a
    stale or missing gate would change every loss after the first."""
    lr = 0.5
    want_losses, want = single_process(OptimizerKind.SGD, lr, make=GatedCTR)
    got = run(PSConfig(2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=lr)), make=GatedCTR)
    mean = [sum(ls) / WORKERS for ls in zip(*got.losses, strict=True)]
    assert mean == pytest.approx(want_losses, rel=1e-5)
    assert not torch.equal(want["gate.weight"], GatedCTR().gate.weight.detach())  # it learns
    for name, value in want.items():
        torch.testing.assert_close(got.params[name], value, **TOL)


def test_dense_weights_read_without_their_module_are_refused(ray_cluster):
    """A loss that reads a dense weight directly (no module call, no table lookup) would
    train on the previous clock's values from clock 2 on: the worker refuses it, names
    the fix, and the run stops its workers and servers."""

    def direct_loss(model, batch):  # type: ignore[no-untyped-def]
        return model.gate.weight.square().sum()

    config = PSConfig(2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.1))
    run_ = PSRun(GatedCTR, DATA, direct_loss, workers=WORKERS, steps=STEPS, config=config)
    with pytest.raises(ConfigError, match="no module owning dense parameters ran its forward"):
        run_.result()
    assert all(_stopped(lambda w=w: w.ready.remote()) for w in run_.workers)
    assert all(_stopped(lambda s=s: s.status.remote()) for s in run_.servers)


def _stopped(call) -> bool:  # type: ignore[no-untyped-def]
    """Whether the actor behind ``call`` is dead within 30 s (``ray.kill`` is
    asynchronous: a call right after it may still be answered)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(call(), timeout=5)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_ssp_zero_equals_bsp(ray_cluster):
    opt = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05)
    bsp = run(PSConfig(2, optimizer=opt))
    ssp = run(PSConfig(2, optimizer=opt, consistency=ConsistencySpec(Consistency.SSP, 0)))
    assert ssp.losses == bsp.losses
    for name, value in bsp.params.items():
        assert torch.equal(ssp.params[name], value), name


@pytest.mark.parametrize("mode", [Consistency.BSP, Consistency.ASP])
def test_sigkilled_server_is_restored_from_its_snapshot(ray_cluster, tmp_path, mode):
    steps, every = 40, 5
    config = PSConfig(
        2,
        optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.05),
        consistency=ConsistencySpec(mode),
        snapshot_dir=str(tmp_path),
        snapshot_every=every,
    )
    job = PSRun(
        factory,
        dataclasses.replace(DATA, delay_s=0.05),
        ctr_loss,
        workers=WORKERS,
        steps=steps,
        config=config,
    )
    while job.server_status()[1]["applied"] < 13:  # mid-interval: last snapshot at 10
        time.sleep(0.05)
    before = job.server_status()[1]
    os.kill(before["pid"], signal.SIGKILL)
    result = job.result()
    after = result.server_status[1]
    assert after["pid"] != before["pid"] and after["restored_from"] is not None
    lost = before["applied"] - after["restored_from"]
    print(
        f"server 1 killed at clock {before['applied']}, restored from "
        f"{after['restored_from']}: {lost} clock(s) lost"
    )
    # restored from the latest snapshot: it lost only the clocks applied since then
    assert after["restored_from"] >= before["snapshot_clock"] and lost <= every
    assert [len(ls) for ls in result.losses] == [steps] * WORKERS  # training finished
    assert after["applied"] == steps
