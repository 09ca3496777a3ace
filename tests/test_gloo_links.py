"""A rank that leaves a broken collective cuts its gloo connections, so a peer waiting
on it fails at once ("connection closed") instead of at the group's timeout, even while
this rank's DistributedDataParallel model (which holds the process group open) lives on:
the stall that a survivor of a lost node otherwise sits through (up to the 30 s after
which the controller gives it up)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from unipar.runtime.elastic.gloo_links import GlooLinks
from unipar.runtime.elastic.rendezvous import Rendezvous, join, leave

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

TIMEOUT_S = 60.0


def _rank(rank: int, rendezvous: Rendezvous, errors, done, subgroup: bool) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    links = GlooLinks()
    signal = join(rendezvous, rank, backend="gloo", timeout_s=TIMEOUT_S, links=links)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    # a device mesh's dimension is a group of its own, with its own gloo connections,
    # made after the world's: recorded once the gang is formed
    group = dist.new_group([0, 1], timeout=timedelta(seconds=TIMEOUT_S)) if subgroup else None
    if subgroup:
        links.record_again(signal.store, rank, 2)
    dist.all_reduce(torch.ones(2), group=group)
    if rank == 0:  # it failed elsewhere: it never enters the next collective
        time.sleep(0.5)
        errors.put(("cut", links.cut()))
        leave()
        # the process and its model live on, as a survivor's do, past the peer's timeout
        done.wait(3 * TIMEOUT_S)
        del model
        return
    try:
        dist.all_reduce(torch.ones(1000), group=group)
        errors.put(("completed", ""))
    except RuntimeError as error:
        errors.put(("raised", str(error)))
    leave()


@pytest.mark.parametrize("subgroup", [False, True], ids=["world", "mesh-dimension"])
def test_a_peer_waiting_on_a_rank_that_cut_its_links_fails_at_once(subgroup):
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True,
                          timeout=timedelta(seconds=TIMEOUT_S), wait_for_workers=False,
                          use_libuv=True)
    rendezvous = Rendezvous("127.0.0.1", int(store.port), world_size=2, generation=1)
    context = mp.get_context("spawn")
    errors, done = context.Queue(), context.Event()
    ranks = [context.Process(target=_rank, args=(r, rendezvous, errors, done, subgroup))
             for r in range(2)]
    for process in ranks:
        process.start()
    results = dict(errors.get(timeout=3 * TIMEOUT_S) for _ in range(2))
    done.set()
    for process in ranks:
        process.join(timeout=30)
    assert results["cut"] >= 1, results
    # a timeout would say "Timed out waiting"; a cut link says the peer closed it
    assert "closed" in results["raised"].lower(), results
