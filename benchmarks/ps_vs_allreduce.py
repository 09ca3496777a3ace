"""Parameter server vs all-reduce on a click-through-rate model, and stragglers.

Part 1, one invocation: the CTR model (``--rows`` embedding rows, default 10M, width
``--dim``) trained by 2 workers, sweeping the fraction of rows each worker's batch
touches per step. At each point: the measured step time and bytes per worker of
(a) 2 parameter servers (rows pulled and pushed sparsely, BSP) and (b) a gloo
all-reduce of every gradient (the table's dense gradient included) with a local SGD
step; and the planner's pick (``unipar.ps.choose_grad_sync``), priced with link speeds
calibrated here before the sweep (a gloo all-reduce, an actor call, a tensor fetched
from an actor, an SGD update). ``planner_right`` = share of points where the pick was
the measured-faster side.

Part 2: 4 workers, one 2x slower (it sleeps as long again as each of its steps), the
same total worker-steps under BSP, SSP (bound ``--staleness``) and ASP; throughput =
worker-steps/s; final loss on held-out batches. ``straggler_speedup`` is SSP's
throughput over BSP's, ``asp_speedup`` ASP's, ``loss_gap`` the relative held-out loss
gap of SSP to BSP (``asp_loss_gap`` likewise).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import socket
import statistics
import time

import torch

from unipar.models.ctr import CTRModel, ZipfClicks, ctr_loss
from unipar.ps import (
    Consistency,
    ConsistencySpec,
    Links,
    SparseWorkload,
    SyncKind,
    choose_grad_sync,
)
from unipar.ps.optim import OptimizerKind, OptimizerSpec
from unipar.ps.partition import TensorInfo, partition
from unipar.ps.train import PSConfig, PSRun

FIELDS = 4


@dataclasses.dataclass(frozen=True)
class UniformClicks:
    """Batches touching about ``touched`` rows each (uniform ids)."""

    rows: int
    touched: int

    def __call__(self, worker: int, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(clock * 1009 + worker)
        n = max(self.touched // FIELDS, 1)
        ids = torch.randint(0, self.rows, (n, FIELDS), generator=g)
        return ids, (torch.rand(n, generator=g) < 0.3).float()


class AllReduceWorker:
    """A worker that holds the whole model and all-reduces every gradient (gloo)."""

    def __init__(self, rank: int, world: int, port: int, rows: int, dim: int) -> None:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        self.world = world
        self.model = CTRModel(rows, dim, FIELDS, seed=0)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def calibrate(self, nbytes: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` (median of 3)."""
        import torch.distributed as dist

        t = torch.zeros(nbytes // 4)
        times = []
        for _ in range(4):
            dist.barrier()
            began = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - began)
        return statistics.median(times[1:])

    def run(self, data, steps: int) -> list[float]:
        import torch.distributed as dist

        times = []
        for clock in range(1, steps + 1):
            began = time.perf_counter()
            self.opt.zero_grad()
            ctr_loss(self.model, data(dist.get_rank(), clock)).backward()
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(self.world)
            self.opt.step()
            times.append(time.perf_counter() - began)
        return times


class Echo:
    def ping(self) -> int:
        return 0

    def tensor(self, n: int) -> torch.Tensor:
        return torch.ones(n)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row_cost(rows: int, dim: int, n: int = 200_000) -> float:
    """Seconds per touched row of the PS row path, timed on a table of ``rows`` rows
    without Ray: unique ids, route to 2 servers, gather (pull), then on the server the
    unique + index_add of the pushed rows and an SGD update of them."""
    table = torch.ones(rows, dim)  # written, so no page is first touched while timed
    parts = partition([TensorInfo("t", (rows, dim), embedding=True)], 2)
    ids = torch.randint(0, rows, (n,))
    began = time.perf_counter()
    unique = torch.unique(ids)
    server, local = parts.locate("t", unique)
    for s in range(2):
        mine = local[server == s]
        pulled = table[mine]
        u, inverse = torch.unique(mine, return_inverse=True)
        summed = torch.zeros(len(u), dim).index_add_(0, inverse, pulled)
        table[u] = table[u] - 0.1 * summed
    return (time.perf_counter() - began) / len(unique)


def calibrate(ray, ar_workers, rows: int, dim: int) -> Links:
    nbytes = 32 * 2**20
    small, large = ray.get([w.calibrate.remote(4096) for w in ar_workers])[0], None
    large = ray.get([w.calibrate.remote(nbytes) for w in ar_workers])[0]
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
    # the all-reduce side's per-step table work, timed on the real size: a fresh dense
    # gradient of the table (zero-filled) and an SGD update with it
    table = torch.ones(rows, dim)
    began = time.perf_counter()
    for _ in range(2):
        grad = torch.zeros(rows, dim)
        grad[:1000] += 1
        table.add_(grad, alpha=-0.1)
    update_bw = 3 * table.numel() * 4 / ((time.perf_counter() - began) / 2)
    del table, grad
    return Links(
        row_s=statistics.median(row_cost(rows, dim) for _ in range(3)),
        all_reduce_bw=all_reduce_bw,
        worker_bw=ps_bw,
        server_bw=ps_bw,
        latency_s=small / 2,
        ps_latency_s=ps_latency,
        update_bw=update_bw,
    )


def sweep_point(ray, args, ar_workers, links, fraction: float) -> dict:
    touched = max(int(fraction * args.rows), FIELDS)
    data = UniformClicks(args.rows, touched)
    steps = args.warmup + args.steps
    ar = ray.get([w.run.remote(data, steps) for w in ar_workers])
    ar_s = statistics.median(t for times in ar for t in times[args.warmup :])
    factory = functools.partial(CTRModel, args.rows, args.dim, FIELDS, seed=0)
    config = PSConfig(num_servers=2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.05))
    ps = PSRun(factory, data, ctr_loss, workers=2, steps=steps, config=config).result()
    ps_s = statistics.median(t for times in ps.step_s for t in times[args.warmup :])
    # compute alone: one worker's forward/backward on a batch, tables as pulled rows
    ids, clicks = data(0, 1)
    unique, local = torch.unique(ids, return_inverse=True)
    small = CTRModel(len(unique), args.dim, FIELDS, seed=0)
    began = time.perf_counter()
    for _ in range(3):
        small.zero_grad()
        ctr_loss(small, (local, clicks)).backward()
    compute = (time.perf_counter() - began) / 3
    dense = sum(p.numel() for n, p in small.named_parameters() if not n.startswith("embedding"))
    workload = SparseWorkload(
        table_rows=args.rows,
        dim=args.dim,
        dense_params=dense,
        touched_fraction=len(unique) / args.rows,
        workers=2,
        servers=2,
        serve_dense=True,
        compute_s=compute,
    )
    choice = choose_grad_sync(workload, links)
    faster = SyncKind.PARAMETER_SERVER if ps_s < ar_s else SyncKind.ALL_REDUCE
    return {
        "fraction": fraction,
        "ps_s": ps_s,
        "ar_s": ar_s,
        "ps_bytes": (ps.bytes_pulled + ps.bytes_pushed) / (2 * steps),
        "ar_bytes": choice.all_reduce.bytes_per_worker,
        "pick": choice.kind,
        "right": choice.kind is faster,
        "reason": choice.reason,
    }


def heldout_loss(params: dict[str, torch.Tensor], data: ZipfClicks, args) -> float:
    model = CTRModel(args.straggler_rows, args.dim, FIELDS)
    model.load_state_dict(params)
    with torch.no_grad():
        return statistics.fmean(float(ctr_loss(model, data(10_000, c))) for c in range(1, 41))


def straggler(args) -> dict[Consistency, tuple[float, float]]:
    data = ZipfClicks(args.straggler_rows, batch=256, fields=FIELDS, delay_s=args.delay)
    factory = functools.partial(CTRModel, args.straggler_rows, args.dim, FIELDS, seed=0)
    out = {}
    specs = {
        Consistency.BSP: ConsistencySpec(),
        Consistency.SSP: ConsistencySpec(Consistency.SSP, args.staleness),
        Consistency.ASP: ConsistencySpec(Consistency.ASP),
    }
    for mode, spec in specs.items():
        config = PSConfig(
            num_servers=2, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05), consistency=spec
        )
        result = PSRun(
            factory,
            data,
            ctr_loss,
            workers=4,
            steps=args.straggler_steps,
            config=config,
            slowdown={3: 2.0},
            shared_budget=True,
        ).result()
        out[mode] = (result.steps / result.wall_s, heldout_loss(result.params, data, args))
        print(
            f"straggler {mode.value}: {out[mode][0]:.1f} worker-steps/s, held-out loss "
            f"{out[mode][1]:.4f}, steps per worker {[len(x) for x in result.losses]}",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--fractions", default="0.0001,0.001,0.01,0.1,0.3")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--straggler-rows", type=int, default=100_000)
    parser.add_argument("--straggler-steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.1, help="s to read a batch")
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    port = _port()
    actor = ray.remote(AllReduceWorker).options(num_cpus=0)
    ar_workers = [actor.remote(r, 2, port, args.rows, args.dim) for r in range(2)]
    links = calibrate(ray, ar_workers, args.rows, args.dim)
    print(f"links: {links}", flush=True)
    print(f"{'touched':>9} {'PS ms':>8} {'AR ms':>8} {'PS MiB':>8} {'AR MiB':>8} pick")
    points = []
    for fraction in (float(f) for f in args.fractions.split(",") if f):
        p = sweep_point(ray, args, ar_workers, links, fraction)
        points.append(p)
        print(
            f"{fraction:>9.4%} {p['ps_s'] * 1e3:>8.1f} {p['ar_s'] * 1e3:>8.1f} "
            f"{p['ps_bytes'] / 2**20:>8.2f} {p['ar_bytes'] / 2**20:>8.2f} {p['pick'].value}"
            f" ({'right' if p['right'] else 'WRONG'}): {p['reason']}",
            flush=True,
        )
    for w in ar_workers:
        ray.kill(w)
    out = straggler(args)
    bsp_rate, bsp_loss = out[Consistency.BSP]
    ssp_rate, ssp_loss = out[Consistency.SSP]
    asp_rate, asp_loss = out[Consistency.ASP]
    right = sum(p["right"] for p in points) / max(len(points), 1)
    print(f"load average: {os.getloadavg()}")
    print(
        f"RESULT planner_right={right:.2f} straggler_speedup={ssp_rate / bsp_rate:.2f} "
        f"loss_gap={(ssp_loss - bsp_loss) / bsp_loss:.4f} asp_speedup={asp_rate / bsp_rate:.2f} "
        f"asp_loss_gap={(asp_loss - bsp_loss) / bsp_loss:.4f}"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
