"""The all-reduce baselines of ps_vs_allreduce.py and the link calibration the planner is
priced with.

:class:`CollectiveWorker` holds the whole CTR model (gloo, one process per worker) and
trains it two ways, on the same batches the parameter-server side gets:

- dense: every gradient all-reduced (the table's dense gradient as one tensor, the MLP's
  flattened into one buffer), then a local SGD step: what plain data parallel does;
- sparse: each worker looks up only the rows its batch touches (unique ids), computes
  their gradient rows, all-gathers the ids and rows (padded to the largest count) and
  applies every worker's rows with ``index_add_``, the MLP's gradient all-reduced: the
  exchange frameworks use for embeddings (sparse gradients, all-gather of rows) instead of
  reducing a mostly-zero dense table.

Both are plain SGD on the mean gradient over the workers, so after the same steps on the
same batches they and the parameter servers (BSP, SGD) hold the same parameters: checked.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from torch import nn

from unipar.models.ctr import CTRModel
from unipar.plan.sync_cost import Links

FIELDS = 4
LR = 0.05


@dataclasses.dataclass(frozen=True)
class UniformClicks:
    """Batches touching about ``touched`` rows each (uniform ids), reproducible from
    ``seed`` (calibration runs use another seed than the sweep)."""

    rows: int
    touched: int
    seed: int = 0

    def __call__(self, worker: int, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + clock * 1009 + worker)
        n = max(self.touched // FIELDS, 1)
        ids = torch.randint(0, self.rows, (n, FIELDS), generator=g)
        return ids, (torch.rand(n, generator=g) < 0.3).float()


class CollectiveWorker:
    """One worker of the all-reduce baselines (see the module doc)."""

    def __init__(self, rank: int, world: int, port: int, rows: int, dim: int) -> None:
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        self.rank, self.world, self.rows, self.dim = rank, world, rows, dim
        self.model = CTRModel(rows, dim, FIELDS, seed=0)

    def reset(self) -> None:
        """The model as it was built (the parameter-server side starts from it too)."""
        self.model = CTRModel(self.rows, self.dim, FIELDS, seed=0)

    def state(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def calibrate(self, nbytes: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` (median of 3, after one unmeasured)."""
        import torch.distributed as dist

        t = torch.zeros(nbytes // 4)
        times = []
        for _ in range(4):
            dist.barrier()
            began = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - began)
        return statistics.median(times[1:])

    def run(self, data, steps: int, sparse: bool) -> list[float]:  # type: ignore[no-untyped-def]
        """Train ``steps`` clocks (1..steps) from the built model; each step's seconds."""
        import torch.distributed as dist

        self.reset()
        times = []
        step = self._sparse_step if sparse else self._dense_step
        for clock in range(1, steps + 1):
            dist.barrier()
            began = time.perf_counter()
            step(data(self.rank, clock))
            times.append(time.perf_counter() - began)
        return times

    def _mlp_all_reduce(self) -> None:
        """The MLP's gradients, flattened into one buffer, all-reduced and averaged."""
        import torch.distributed as dist

        grads = [p.grad for p in self.model.mlp.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(self.world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _sgd(self, params) -> None:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-LR)
                p.grad = None

    def _dense_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        import torch.distributed as dist

        ids, clicks = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(ids), clicks)
        loss.backward()
        table = self.model.embedding.weight
        dist.all_reduce(table.grad)
        table.grad.div_(self.world)
        self._mlp_all_reduce()
        self._sgd(self.model.parameters())

    def _sparse_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        import torch.distributed as dist

        ids, clicks = batch
        table = self.model.embedding.weight
        unique, local = torch.unique(ids, return_inverse=True)
        rows = table.detach()[unique].requires_grad_()
        logits = self.model.mlp(nn.functional.embedding(local, rows).flatten(1)).squeeze(-1)
        nn.functional.binary_cross_entropy_with_logits(logits, clicks).backward()
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        dist.all_gather(counts, torch.tensor([len(unique)]))
        most = int(max(c.item() for c in counts))
        padded_ids = torch.zeros(most, dtype=torch.long)
        padded_ids[: len(unique)] = unique
        padded_rows = torch.zeros(most, self.dim)
        padded_rows[: len(unique)] = rows.grad
        all_ids = [torch.empty_like(padded_ids) for _ in range(self.world)]
        all_rows = [torch.empty_like(padded_rows) for _ in range(self.world)]
        dist.all_gather(all_ids, padded_ids)
        dist.all_gather(all_rows, padded_rows)
        self._mlp_all_reduce()
        with torch.no_grad():
            for count, got_ids, got_rows in zip(counts, all_ids, all_rows, strict=True):
                n = int(count.item())
                table.index_add_(0, got_ids[:n], got_rows[:n], alpha=-LR / self.world)
        self._sgd(self.model.mlp.parameters())


class Echo:
    def ping(self) -> int:
        return 0

    def tensor(self, n: int) -> torch.Tensor:
        return torch.ones(n)


def calibrate_links(ray, workers, rows: int, dim: int) -> Links:  # type: ignore[no-untyped-def]
    """Link speeds as the planner prices them, measured here: a gloo all-reduce (latency
    and bandwidth), an actor call and a tensor fetched from an actor, and the all-reduce
    side's per-step table work (a fresh dense gradient of the table and an SGD update)."""
    nbytes = 32 * 2**20
    small = ray.get([w.calibrate.remote(4096) for w in workers])[0]
    large = ray.get([w.calibrate.remote(nbytes) for w in workers])[0]
    all_reduce_bw = nbytes / max(large - small, 1e-6)  # one all-reduce of 2 moves 1x bytes
    echo = ray.remote(Echo).options(num_cpus=0).remote()
    ray.get(echo.ping.remote())
    began = time.perf_counter()
    for _ in range(20):
        ray.get(echo.ping.remote())
    ps_latency = (time.perf_counter() - began) / 20
    ray.get(echo.tensor.remote(nbytes // 4))
    began = time.perf_counter()
    for _ in range(3):
        ray.get(echo.tensor.remote(nbytes // 4))
    ps_bw = nbytes / ((time.perf_counter() - began) / 3 - ps_latency)
    ray.kill(echo)
    table = torch.ones(rows, dim)
    began = time.perf_counter()
    for _ in range(2):
        grad = torch.zeros(rows, dim)
        grad[:1000] += 1
        table.add_(grad, alpha=-0.1)
    update_bw = 3 * table.numel() * 4 / ((time.perf_counter() - began) / 2)
    return Links(all_reduce_bw=all_reduce_bw, worker_bw=ps_bw, server_bw=ps_bw,
                 latency_s=small / 2, ps_latency_s=ps_latency, update_bw=update_bw)


def max_param_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over every parameter; inf when their names or shapes differ."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
