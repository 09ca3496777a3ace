"""The pieces of elastic training that run without Ray: in-memory DCP snapshots, the
snapshot cadence, and the stop-at-a-step-boundary protocol over a real TCPStore."""

from __future__ import annotations

import torch

from unipar.runtime.elastic.rendezvous import RendezvousHost, StopSignal
from unipar.runtime.elastic.snapshot import SnapshotCadence, load_from_memory, save_to_memory


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_snapshot_round_trip_through_memory_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, optimizer = _trained(0)
    part = save_to_memory(7, 0, parts=[model], optimizers=[optimizer], collective=False)
    assert part.step == 7 and ".metadata" in part.files and part.nbytes > 0
    other, other_optimizer = _trained(1)
    load_from_memory([part], parts=[other], optimizers=[other_optimizer], collective=False)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name
    moments = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, other_optimizer.state_dict()["state"][0]["exp_avg"])
    assert list(tmp_path.iterdir()) == []  # nothing written to disk


def test_fixed_cadence():
    cadence = SnapshotCadence(5, start=3)
    assert [s for s in range(3, 20) if cadence.due(s)][:1] == [8]
    cadence.took(8, 0.5)
    assert cadence.due(13) and not cadence.due(12)
    assert not SnapshotCadence(0, start=0).due(10**6)


def test_adaptive_cadence_spends_the_budget():
    cadence = SnapshotCadence(None, start=0, budget=0.02, first=10)
    assert not cadence.due(9) and cadence.due(10)
    for _ in range(10):
        cadence.add_step(0.05)
    cadence.took(10, 0.1)  # 0.1 s / (2% of 0.05 s per step) = 100 steps
    assert not cadence.due(109) and cadence.due(110)


def test_every_rank_stops_before_the_same_step():
    host = RendezvousHost()
    rendezvous = host.new(2, timeout_s=10)
    import torch.distributed as dist

    def client():  # type: ignore[no-untyped-def]
        return dist.TCPStore(rendezvous.address, rendezvous.port, is_master=False)

    rank0, rank1 = StopSignal(client(), 0, 2), StopSignal(client(), 1, 2)
    assert not rank0.stop_before(4) and not rank1.stop_before(4)
    host.request_stop()
    assert not rank1.stop_before(5)  # rank 1 may start step 5 before rank 0 saw the request
    assert not rank0.stop_before(5)  # rank 0 sees it and still runs step 5 ...
    assert rank0.stop_before(6) and rank1.stop_before(6)  # ... both stop before step 6
    # A new formation has a fresh store: the old request is not in it.
    fresh = host.new(1, timeout_s=10)
    alone = StopSignal(dist.TCPStore(fresh.address, fresh.port, is_master=False), 0, 1)
    assert not alone.stop_before(6)
    host.request_stop()
    assert alone.stop_before(6)  # alone, rank 0 stops at once
    host.close()


def test_every_rank_takes_a_batch_set_from_outside_before_the_same_step():
    """A global batch the controller passes on (a scheduler's) applies on every rank from
    the same step, and two requests in quick succession are both seen, in order."""
    host = RendezvousHost()
    rendezvous = host.new(2, timeout_s=10)
    import torch.distributed as dist

    def client():  # type: ignore[no-untyped-def]
        return dist.TCPStore(rendezvous.address, rendezvous.port, is_master=False)

    rank0, rank1 = StopSignal(client(), 0, 2), StopSignal(client(), 1, 2)
    assert rank0.batch_before(3) is None and rank1.batch_before(3) is None
    host.request_batch(24)
    assert rank1.batch_before(4) is None  # rank 1 may start step 4 before rank 0 saw it
    assert rank0.batch_before(4) is None  # rank 0 names step 5 and runs step 4 as it was
    host.request_batch(48)
    assert rank0.batch_before(5) == 24  # the second named for step 6
    assert rank1.batch_before(5) == 24 and rank1.batch_before(6) == 48  # none missed
    assert rank0.batch_before(6) == 48 and rank0.batch_before(7) is None
    host.close()
