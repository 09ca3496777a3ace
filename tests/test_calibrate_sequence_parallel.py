"""The CPU calibration times sequence parallelism's layouts as the runtime applies them:
two gloo processes (no Ray) split blocks of a norm and a column/row pair with the
runtime's own ``sequence_parallel_styles`` and with plain tensor parallelism, and what
the layouts take more per split module and pass, beyond the collectives the cost model
prices, is positive and of the order of the framework's per-op costs. About 12 s of
CPU (20 s wall at load 9 on 2 cores): two processes importing torch and unipar, then
a few seconds of timing."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from unipar.runtime.calibrate_group import _sequence_parallel_overhead


def _rank(rank: int, store_file: str, results: dict) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    # a file store, not a TCP port: no port another test process could take between
    # choosing it and binding it
    dist.init_process_group(
        "gloo", init_method=f"file://{store_file}", rank=rank, world_size=2
    )
    try:
        results[rank] = _sequence_parallel_overhead(1e-4, 1e9, blocks=4)
        dist.barrier()  # neither rank leaves while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_sequence_parallel_layouts_cost_more_than_plain_tensor_parallelism(
    tmp_path: Path,
):
    store_file = str(tmp_path / "store")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(store_file, results), nprocs=2, join=True)
        overhead = dict(results)
    # per split module and pass: above nothing, below 50 ms (a calibration of this
    # machine measured 1.1 ms at load 5-7)
    assert all(0 < seconds < 0.05 for seconds in overhead.values()), overhead
