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

Part 2: ``--straggler-workers`` (default 8) sharing the same total worker-steps under
BSP, SSP (bound ``--staleness``) and ASP, one worker at a time 2x slower (it sleeps as
long again as its own work took, waits in pulls left out): transient (the slow worker
changes every ``--rotate-every`` clocks, what SSP is for) and persistent (always the
last worker). Throughput = worker-steps/s; final loss on held-out batches. With ``n``
workers a transient straggler caps BSP at one slow step per clock, ``2t``, while SSP
runs each worker at its mean ``(1 + 1/n) t``: an ideal gain of ``2 / (1 + 1/n)``, 1.6
for 4 workers and 1.78 for 8. ``straggler_speedup`` is SSP's throughput over BSP's
(transient), ``loss_gap`` the relative held-out loss gap of SSP to BSP; the persistent
case's SSP and ASP gains are printed beside them (SSP's lead is bounded by ``s``, so
its long-run gain there is small by design; ASP's ideal is ``2 - 1/n``).
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
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.plan.representation import GradSync
from unipar.plan.sync_cost import Links, SparseWorkload, choose_grad_sync, price_ps
from unipar.ps import Consistency, ConsistencySpec
from unipar.runtime.servers.train import PSConfig, PSRun, Slowdown

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
        all_reduce_bw=all_reduce_bw,
        worker_bw=ps_bw,
        server_bw=ps_bw,
        latency_s=small / 2,
        ps_latency_s=ps_latency,
        update_bw=update_bw,
    )


@dataclasses.dataclass(frozen=True)
class PSPoint:
    """One PS measurement: the median step time, and what the cost model needs."""

    step_s: float
    bytes_per_worker: float
    workload: SparseWorkload


def measure_ps(args, fraction: float, timed_steps: int | None = None) -> PSPoint:
    """2 workers, 2 servers, BSP, SGD: median step time over ``timed_steps`` (default
    ``--steps``) after warm-up; the compute of one worker's forward/backward alone
    (tables as the pulled rows) goes to the model."""
    touched = max(int(fraction * args.rows), FIELDS)
    data = UniformClicks(args.rows, touched)
    steps = args.warmup + (timed_steps or args.steps)
    factory = functools.partial(CTRModel, args.rows, args.dim, FIELDS, seed=0)
    config = PSConfig(num_servers=2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.05))
    ps = PSRun(factory, data, ctr_loss, workers=2, steps=steps, config=config).result()
    ps_s = statistics.median(t for times in ps.step_s for t in times[args.warmup :])
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
    return PSPoint(ps_s, (ps.bytes_pulled + ps.bytes_pushed) / (2 * steps), workload)


def calibrate_rows(args, links: Links) -> Links:
    """The per-row cost of the PS path, end to end: PS runs at the two touched shares of
    ``--calibrate-at`` (not sweep points); the growth of the measured step time beyond
    what the model prices without rows (compute, bytes over the measured link, round
    trips), per extra touched row. The slope leaves out what does not grow with rows.
    Each end is a median over ``--calibrate-steps`` steps: the slope of two short runs
    on a shared machine carries their noise into every prediction."""
    low, high = (
        measure_ps(args, float(f), args.calibrate_steps) for f in args.calibrate_at.split(",")
    )
    measured = high.step_s - low.step_s
    priced = price_ps(high.workload, links).step_s - price_ps(low.workload, links).step_s
    rows = (high.workload.touched_fraction - low.workload.touched_fraction) * args.rows
    row_s = max(measured - priced, 0.0) / rows
    print(
        f"row cost: {row_s * 1e9:.0f} ns per touched row (+{rows:,.0f} rows: step "
        f"+{measured * 1e3:.1f} ms, of which +{priced * 1e3:.1f} ms priced without rows)",
        flush=True,
    )
    return dataclasses.replace(links, row_s=row_s)


def sweep_point(ray, args, ar_workers, links, fraction: float) -> dict:
    touched = max(int(fraction * args.rows), FIELDS)
    data = UniformClicks(args.rows, touched)
    ar = ray.get([w.run.remote(data, args.warmup + args.steps) for w in ar_workers])
    ar_s = statistics.median(t for times in ar for t in times[args.warmup :])
    ps = measure_ps(args, fraction)
    choice = choose_grad_sync(ps.workload, links)
    faster = GradSync.PARAMETER_SERVER if ps.step_s < ar_s else GradSync.ALL_REDUCE
    return {
        "fraction": fraction,
        "ps_s": ps.step_s,
        "ar_s": ar_s,
        "ps_bytes": ps.bytes_per_worker,
        "ar_bytes": choice.all_reduce.bytes_per_worker,
        "pick": choice.kind,
        "right": choice.kind is faster,
        "reason": choice.reason,
        "predicted": (choice.ps.step_s, choice.all_reduce.step_s),
    }


def heldout_loss(params: dict[str, torch.Tensor], data: ZipfClicks, args) -> float:
    model = CTRModel(args.straggler_rows, args.dim, FIELDS)
    model.load_state_dict(params)
    with torch.no_grad():
        return statistics.fmean(float(ctr_loss(model, data(10_000, c))) for c in range(1, 41))


@dataclasses.dataclass(frozen=True)
class OnDevice:
    """The CTR loss, then ``seconds`` of simulated accelerator time (the forward and
    backward passes of a worker with a device of its own: 2 cores cannot run 8 workers'
    real work side by side). It falls between the pull and the push, as real compute
    does: a step cannot start it before its parameters are in."""

    seconds: float

    def __call__(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        loss = ctr_loss(model, batch)
        time.sleep(self.seconds)
        return loss


def straggler_run(args, spec: ConsistencySpec, slowdown: Slowdown) -> tuple[float, float]:
    """``--straggler-workers`` sharing ``--straggler-steps`` worker-steps each:
    (worker-steps/s, held-out loss)."""
    data = ZipfClicks(args.straggler_rows, batch=256, fields=FIELDS)
    factory = functools.partial(CTRModel, args.straggler_rows, args.dim, FIELDS, seed=0)
    config = PSConfig(
        num_servers=2, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05), consistency=spec
    )
    result = PSRun(
        factory,
        data,
        OnDevice(args.compute),
        workers=args.straggler_workers,
        steps=args.straggler_steps,
        config=config,
        slowdown=slowdown,
        shared_budget=True,
    ).result()
    rate, loss = result.steps / result.wall_s, heldout_loss(result.params, data, args)
    print(
        f"  {spec.mode.value}: {rate:.1f} worker-steps/s, held-out loss {loss:.4f}, "
        f"steps per worker {[len(x) for x in result.losses]}",
        flush=True,
    )
    return rate, loss


def straggler(args) -> dict[tuple[str, Consistency], tuple[float, float]]:
    """BSP, SSP and ASP with one worker 2x slower: transient (the slow worker changes
    every ``--rotate-every`` clocks) and persistent (always the same worker)."""
    specs = {
        Consistency.BSP: ConsistencySpec(),
        Consistency.SSP: ConsistencySpec(Consistency.SSP, args.staleness),
        Consistency.ASP: ConsistencySpec(Consistency.ASP),
    }
    kinds = {
        "transient": Slowdown(2.0, rotate_every=args.rotate_every),
        "persistent": Slowdown(2.0, worker=args.straggler_workers - 1),
    }
    out = {}
    for kind, slowdown in kinds.items():
        print(f"straggler, {kind}: {slowdown}", flush=True)
        for mode, spec in specs.items():
            out[kind, mode] = straggler_run(args, spec, slowdown)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--fractions", default="0.0001,0.001,0.01,0.1,0.3")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--calibrate-at", default="0.005,0.05", help="two touched shares timed for the row cost"
    )
    parser.add_argument(
        "--calibrate-steps", type=int, default=8, help="steps timed at each calibration share"
    )
    parser.add_argument("--straggler-rows", type=int, default=100_000)
    parser.add_argument("--straggler-steps", type=int, default=40)
    parser.add_argument("--straggler-workers", type=int, default=8)
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument(
        "--rotate-every", type=int, default=2, help="clocks per transient straggler"
    )
    parser.add_argument(
        "--compute", type=float, default=0.1, help="s of simulated device time per step"
    )
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    port = _port()
    actor = ray.remote(AllReduceWorker).options(num_cpus=0)
    ar_workers = [actor.remote(r, 2, port, args.rows, args.dim) for r in range(2)]
    links = calibrate_rows(args, calibrate(ray, ar_workers, args.rows, args.dim))
    print(f"links: {links}", flush=True)
    print(
        f"{'touched':>9} {'PS ms':>8} {'AR ms':>8} {'PS pred':>8} {'AR pred':>8} "
        f"{'PS MiB':>8} {'AR MiB':>8} pick"
    )
    points = []
    for fraction in (float(f) for f in args.fractions.split(",") if f):
        p = sweep_point(ray, args, ar_workers, links, fraction)
        points.append(p)
        print(
            f"{fraction:>9.4%} {p['ps_s'] * 1e3:>8.1f} {p['ar_s'] * 1e3:>8.1f} "
            f"{p['predicted'][0] * 1e3:>8.1f} {p['predicted'][1] * 1e3:>8.1f} "
            f"{p['ps_bytes'] / 2**20:>8.2f} {p['ar_bytes'] / 2**20:>8.2f} {p['pick'].value}"
            f" ({'right' if p['right'] else 'WRONG'}): {p['reason']}",
            flush=True,
        )
    for w in ar_workers:
        ray.kill(w)
    out = straggler(args)
    right = sum(p["right"] for p in points) / max(len(points), 1)

    def versus_bsp(kind: str, mode: Consistency) -> tuple[float, float]:
        (rate, loss), (bsp_rate, bsp_loss) = out[kind, mode], out[kind, Consistency.BSP]
        return rate / bsp_rate, (loss - bsp_loss) / bsp_loss

    speedup, gap = versus_bsp("transient", Consistency.SSP)
    fixed_ssp, _ = versus_bsp("persistent", Consistency.SSP)
    fixed_asp, fixed_asp_gap = versus_bsp("persistent", Consistency.ASP)
    print(f"load average: {os.getloadavg()}")
    print(
        f"RESULT planner_right={right:.2f} straggler_speedup={speedup:.2f} loss_gap={gap:.4f} "
        f"persistent_ssp_speedup={fixed_ssp:.2f} persistent_asp_speedup={fixed_asp:.2f} "
        f"persistent_asp_loss_gap={fixed_asp_gap:.4f}"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
