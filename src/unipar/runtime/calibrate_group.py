"""Measure what a group of CPU worker processes costs beyond their arithmetic: gloo
collectives and the framework's own work per operation. Run as two processes::

    python -m unipar.runtime.calibrate_group RANK WORLD PORT

It measures against the planner's cost model (the sustained slowdown below is measured
over predicted time) and times the runtime's own sequence-parallel layouts, so it sits
above both, in the runtime; :mod:`unipar.cluster.calibrate`
starts it and turns its numbers into the CPU's :class:`~unipar.cluster.spec.DeviceSpec`.

Rank 0 prints one JSON object:

- ``matmul_flops``, ``elementwise_bandwidth``, ``optimizer_bandwidth``: arithmetic
  rates measured on every rank at once (workers share memory bandwidth and clock); the
  matmul rate is the median over the product shapes of small models' training;
- ``sustained_slowdown``: measured over predicted step time of a reference network
  (residual MLP blocks) trained on every rank at once for a few seconds, by which the
  rates are scaled;
- ``op_overhead_s``: fixed cost of one operation in training (dispatch, autograd
  record, backward), from forward+backward of a chain of tiny linear layers, per op
  per pass (backward counts as two passes);
- ``allreduce_latency_s`` / ``allreduce_bandwidth``: the alpha-beta fit of gloo
  all-reduce at 256 KiB and 4 MiB (Hockney's model, as in Thakur et al. 2005);
- ``sharded_linear_overhead_s``: extra time of one tensor-parallel linear layer
  (DTensor column- then row-wise) per pass, beyond its arithmetic and its all-reduce;
- ``sequence_parallel_overhead_s``: what such a layer takes more per pass under the
  runtime's sequence-parallel layouts, beyond their collectives;
- ``fsdp_unit_overhead_s``, ``fsdp_step_overhead_s``, ``fsdp_tensor_overhead_s``,
  ``fsdp_gather_overhead_s``: FSDP2's extra time per parameter and pass of each micro-batch,
  per unit and step, per sharded parameter and step, and per unit and all-gather,
  beyond its collectives (:class:`FsdpOverheads`); the chain's units hold two tensors
  each, and the cost model prices a micro-batch whose weights are held per unit at twice
  the per-parameter rate (:mod:`unipar.plan.fsdp_framework`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from unipar.analysis.profile import analyze
from unipar.cluster.calibrate import (
    SMALL_MODEL_MATMULS,
    measure_elementwise_bandwidth,
    measure_matmul_flops,
)
from unipar.cluster.spec import ClusterSpec, Collectives, DeviceSpec, LinkSpec, Precision
from unipar.plan.collectives import Collective
from unipar.plan.cost import ADAM_STEP_BYTES_PER_PARAM, layer_forward_time
from unipar.plan.tp_collectives import tp_collective_counts
from unipar.runtime.parallel.sequence import sequence_parallel_styles

_CHAIN = 48  # tiny layers per measurement
_WIDTH = 8


def _median_time(fn: Callable[[], object], repeats: int = 15) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _chain() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(_WIDTH, _WIDTH) for _ in range(_CHAIN)])


def _sustained_median_time(fn: Callable[[], object], seconds: float) -> float:
    """The median time of ``fn`` run back to back on every rank for ``seconds`` (at
    least 15 times; the ranks agree on the count, as collectives need).

    Latency-like rates (an op's fixed cost, a small collective's) are taken this way,
    not as the best of a few short windows: on a machine whose cores are shared (2
    vCPUs of one host, their siblings busy or not) the best of three 15-call windows
    is a lucky moment. Four calibrations back to back on 2026-11-26 measured the op
    cost at 11.1-18.6 us and the all-reduce latency at 40-86 us that way, and the rates
    a sweep's plans later fitted put the op cost in training at about 2.6 times the
    calibration's (``benchmarks/plan_ranking.py --dump``)."""
    return statistics.median(_sustained_samples(lambda: _timed(fn), seconds))


def _paired_median_difference(
    first: Callable[[], object], second: Callable[[], object], seconds: float
) -> float:
    """The median over a sustained ``seconds`` of ``first``'s time less ``second``'s,
    the two run in pairs, back to back: a rate that is a difference of two timings
    (FSDP's own time: a sharded step less the plain one) is taken from pairs measured
    moments apart, so that the machine's drift over the measurement cancels in each pair
    and an outlier moves the median by one sample. Taken instead as the difference of two
    medians of 15 calls each, apart in time (the smaller of two such), FSDP's per-gather
    rate ranged 0.30-1.41 ms and its per-step rate 0-2.2 ms over calibrations minutes
    apart, and the sweep's ZeRO-3 plans were predicted 8-44% fast while their measured
    times held within 3% (``benchmarks/plan_ranking.py --dump``, 2026-11-26)."""
    pairs = 0

    def pair() -> float:
        # which of the two runs first alternates, so that neither always follows the
        # ranks' agreement to go on
        nonlocal pairs
        pairs += 1
        if pairs % 2:
            return _timed(first) - _timed(second)
        later = _timed(second)
        return _timed(first) - later

    return statistics.median(_sustained_samples(pair, seconds))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _sustained_samples(sample: Callable[[], float], seconds: float) -> list[float]:
    """``sample()`` taken back to back on every rank for ``seconds``, after 3 to warm up:
    at least 15 samples, the same count on every rank (they agree on stopping by an
    all-reduce, as the collectives inside a sample need)."""
    for _ in range(3):
        sample()
    samples: list[float] = []
    dist.barrier()
    deadline = time.perf_counter() + seconds
    while True:
        samples.append(sample())
        go_on = torch.tensor(float(time.perf_counter() < deadline or len(samples) < 15))
        dist.all_reduce(go_on, op=dist.ReduceOp.MIN)
        if not go_on.item():
            return samples


def _op_overhead() -> float:
    """Per op and pass, on tiny tensors, over a sustained second."""
    model, x = _chain(), torch.randn(1, _WIDTH)
    return _sustained_median_time(lambda: model(x).sum().backward(), 1.0) / (_CHAIN * 3)


def _allreduce_time(nbytes: int) -> float:
    tensor = torch.ones(nbytes // 4)
    return _sustained_median_time(lambda: dist.all_reduce(tensor), 0.5)


def _allreduce_fit() -> tuple[float, float]:
    """(latency per ring step, bandwidth): latency from a 4-byte all-reduce, bandwidth
    from a 4 MiB one, each the median over a sustained half second. Ring all-reduce on
    n ranks moves 2(n-1)/n of the bytes in 2(n-1) steps."""
    n = dist.get_world_size()
    tiny = _allreduce_time(4)
    size = 4 * 1024 * 1024
    large = _allreduce_time(size)
    latency = tiny / (2 * (n - 1))
    bandwidth = 2 * (n - 1) / n * size / max(large - tiny, 1e-9)
    return latency, bandwidth


def _ring_seconds(nbytes: float, fraction: float, latency: float, bandwidth: float) -> float:
    """A ring collective as the cost model charges it (``fraction``: 2 for all-reduce,
    1 for all-gather or reduce-scatter)."""
    n = dist.get_world_size()
    return fraction * (n - 1) / n * nbytes / bandwidth + fraction * (n - 1) * latency


def _sharded_linear_overhead(latency: float, bandwidth: float) -> float:

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(_WIDTH, _WIDTH * 2)
            self.proj = nn.Linear(_WIDTH * 2, _WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.proj(torch.relu(self.fc(x)))

    pairs = _CHAIN // 2
    x = torch.randn(1, _WIDTH)
    local = nn.Sequential(*[Pair() for _ in range(pairs)])
    plain = _median_time(lambda: local(x).sum().backward())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sharded = nn.Sequential(*[Pair() for _ in range(pairs)])
    for pair in sharded:
        parallelize_module(pair, mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    split = _median_time(lambda: sharded(x).sum().backward())
    # Each pair all-reduces its output forward and its input gradient backward.
    collectives = pairs * 2 * _ring_seconds(_WIDTH * 4, 2, latency, bandwidth)
    return max(split - plain - collectives, 0.0) / (pairs * 2 * 3)


class _NormPair(nn.Module):
    """A block as sequence parallelism splits it: a norm on the sequence shards, then a
    column-wise and a row-wise linear layer, and the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(_WIDTH)
        self.fc = nn.Linear(_WIDTH, _WIDTH * 2)
        self.proj = nn.Linear(_WIDTH * 2, _WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.fc(self.norm(x))))


def _sequence_parallel_overhead(latency: float, bandwidth: float, blocks: int = 8) -> float:
    """What one tensor-parallel linear layer takes more per pass with sequence
    parallelism than without, beyond the collectives the cost model prices for each
    (:func:`unipar.plan.tp_collectives.tp_collective_counts`): blocks of :class:`_NormPair`
    split by the runtime's own sequence-parallel layouts
    (:func:`unipar.runtime.parallel.sequence.sequence_parallel_styles`) against the
    same blocks under plain tensor parallelism, forward and backward on tiny tensors."""
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(1, 2 * world, _WIDTH)
    nbytes = x.numel() * x.element_size()
    seconds = {}
    for sequence_parallel in (False, True):
        model = nn.Sequential(*[_NormPair() for _ in range(blocks)])
        styles: dict[str, object] = {}
        for index in range(blocks):
            styles[f"{index}.fc"] = ColwiseParallel()
            styles[f"{index}.proj"] = RowwiseParallel()
        if sequence_parallel:
            styles = sequence_parallel_styles(model, styles)
        parallelize_module(model, mesh, styles)  # type: ignore[arg-type]
        step = min(_median_time(lambda m=model: m(x).sum().backward(), 9) for _ in range(2))
        priced = sum(
            (forward + backward)
            * _ring_seconds(nbytes, kind.fraction(Collectives.GLOO), latency, bandwidth)
            for kind, forward, backward in tp_collective_counts(1, 1, sequence_parallel)
        )
        seconds[sequence_parallel] = step - blocks * priced
    return max(seconds[True] - seconds[False], 0.0) / (blocks * 2 * 3)


@dataclass(frozen=True)
class FsdpOverheads:
    """FSDP2's own time beyond arithmetic and collectives: ``tensor_pass_s`` per sharded
    parameter, pass and micro-batch (hooks, bookkeeping); ``unit_step_s`` per unit and
    step (gradients into and out of the reduce-scatter's buffers); ``tensor_step_s`` per
    sharded parameter and step (the optimizer's step on DTensors); ``unit_gather_s`` per
    unit and all-gather (unsharding and resharding it). The first per parameter, the
    last per unit: so the chain's rates (2 parameters a unit) carried to the benchmark's
    GPT (about 14) met its measured steps best, ZeRO-2 with 1 to 8 micro-batches within
    -7..+2% and ZeRO-3 within -6..-23% (plan_ranking, 2026-11-26 00:05, load 1.7-2.1;
    both per unit: -7..-28% and -14..-38%; both per parameter: +18..+23% and +30..+100%)."""

    tensor_pass_s: float
    unit_step_s: float
    tensor_step_s: float
    unit_gather_s: float


def _accumulating_step(model: nn.Module, x: torch.Tensor, microbatches: int) -> Callable[[], None]:
    """A training step of ``microbatches`` backward passes, synced on the last alone as
    the runtime syncs an FSDP model (gradient sync off and gathered weights kept before
    it: ``unipar.runtime.parallel.parallelize``); a plain model just accumulates."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sharded = hasattr(model, "set_requires_gradient_sync")

    def step() -> None:
        for index in range(microbatches):
            hold = sharded and index < microbatches - 1
            if hold:
                model.set_requires_gradient_sync(False)
                model.set_reshard_after_backward(False)
            model(x).sum().backward()
            if hold:
                model.set_requires_gradient_sync(True)
                model.set_reshard_after_backward(True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _optimizer_step(model: nn.Module) -> Callable[[], None]:
    """The optimizer's step alone, on gradients of ones."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    return optimizer.step


def _sharded_chain(reshard_after_forward: bool) -> nn.Module:
    """The chain of tiny layers, each an FSDP unit over the group, and the whole."""
    model = _chain()
    for layer in model:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, reshard_after_forward=reshard_after_forward)


def _fsdp_overheads(latency: float, bandwidth: float, more: int = 3) -> FsdpOverheads:
    """ZeRO-2 over the group (each layer a unit, the runtime's default), against the
    plain chain: the step of 1 and of ``more`` micro-batches (the difference is per
    micro-batch), and the optimizer's step alone (per parameter); ZeRO-3's step of one
    micro-batch, which gathers each unit once more, less ZeRO-2's and that all-gather
    (per unit and all-gather); the rest of ZeRO-2's one micro-batch, less the
    collectives the cost model prices (per unit and step: one reduce-scatter and one
    all-gather, as gloo runs them) and its one gather, is per unit and step."""
    x = torch.randn(1, _WIDTH)
    model, plain = _sharded_chain(False), _chain()
    extra = {
        m: _paired_median_difference(
            _accumulating_step(model, x, m), _accumulating_step(plain, x, m), 0.5
        )
        for m in (1, more)
    }
    tensors = 2 * _CHAIN  # weight and bias
    optimizer = _paired_median_difference(_optimizer_step(model), _optimizer_step(plain), 0.25)
    tensor_step = max(optimizer, 0.0) / tensors
    tensor_pass = max(extra[more] - extra[1], 0.0) / ((more - 1) * tensors * 3)
    unit_bytes = _WIDTH * (_WIDTH + 1) * 4
    gloo = Collectives.GLOO

    def priced(kind: Collective) -> float:
        return _ring_seconds(unit_bytes, kind.fraction(gloo), latency, bandwidth)

    zero3_over_zero2 = _paired_median_difference(
        _accumulating_step(_sharded_chain(True), x, 1), _accumulating_step(model, x, 1), 0.5
    )
    gather = max(zero3_over_zero2 - _CHAIN * priced(Collective.ALL_GATHER), 0.0) / _CHAIN
    collectives = _CHAIN * (priced(Collective.REDUCE_SCATTER) + priced(Collective.ALL_GATHER))
    rest = extra[1] - collectives - _CHAIN * gather - tensors * (3 * tensor_pass + tensor_step)
    return FsdpOverheads(tensor_pass, max(rest, 0.0) / _CHAIN, tensor_step, gather)


def _optimizer_bandwidth(params: int = 1_000_000) -> float:
    """Bytes per second of one AdamW step, counted as the cost model counts them."""
    weights = [nn.Parameter(torch.randn(params // 10)) for _ in range(10)]
    for weight in weights:
        weight.grad = torch.randn_like(weight)
    optimizer = torch.optim.AdamW(weights, lr=1e-4)
    return ADAM_STEP_BYTES_PER_PARAM * params / _median_time(optimizer.step, repeats=7)


def _arithmetic() -> dict[str, float]:
    """Rates with every rank computing at once, as workers do: they share the
    machine's memory bandwidth and clock."""
    dist.barrier()
    flops = statistics.median(measure_matmul_flops(*shape) for shape in SMALL_MODEL_MATMULS)
    dist.barrier()
    elementwise = measure_elementwise_bandwidth()
    return {
        "matmul_flops": flops,
        "elementwise_bandwidth": elementwise,
        "optimizer_bandwidth": _optimizer_bandwidth(),
    }


class _ResidualMLP(nn.Module):
    """The reference network of :func:`_sustained_slowdown`: residual MLP blocks."""

    def __init__(self, width: int = 192, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width),
                nn.Linear(width, 4 * width),
                nn.GELU(),
                nn.Linear(4 * width, width),
            )
            for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _sustained_slowdown(arithmetic: dict[str, float], op_overhead: float) -> float:
    """Measured over predicted time of a training step of a reference network (residual
    MLP blocks, not any model being planned), with every rank training at once for a few
    seconds: what sustained load (shared caches, memory bandwidth and clock) takes
    beyond the short measurements of the single rates."""
    batch, seq, width = 16, 64, 192
    model = _ResidualMLP(width)
    x = torch.randn(batch, seq, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    measured = _sustained_median_time(step, 3.0)

    device = DeviceSpec(
        name="cpu-thread",
        memory_gib=1.0,
        peak_flops_16bit=arithmetic["matmul_flops"],
        peak_flops_32bit=arithmetic["matmul_flops"],
        memory_bandwidth=arithmetic["elementwise_bandwidth"],
        gemm_efficiency=1.0,
        kernel_overhead_s=op_overhead,
        reserved_gib=0.0,
        precision=Precision.FP32,
    )
    profile = analyze(
        lambda: _ResidualMLP(width), (seq, width), input_dtype=torch.float32, hidden=width
    )
    predicted = sum(3 * _layer_forward_seconds(layer, batch, device) for layer in profile.layers)
    predicted += profile.params * ADAM_STEP_BYTES_PER_PARAM / arithmetic["optimizer_bandwidth"]
    return min(max(measured / predicted, 0.5), 3.0)


def _layer_forward_seconds(layer, batch: int, device) -> float:  # type: ignore[no-untyped-def]
    link = LinkSpec(bandwidth=1e9, latency_s=0.0)
    return layer_forward_time(layer, batch, 1, ClusterSpec("cpu", 1, 1, device, link, link))


def main(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    arithmetic = _arithmetic()
    op_overhead = _op_overhead()
    # The sustained slowdown scales every rate of the arithmetic: taken once, over 3 s, a
    # slow stretch of a shared machine then slows every plan's prediction alike (one
    # calibration measured 48.6 GFLOP/s per worker where four around it measured
    # 80.5-87.3, and every plan but the tensor-parallel ones, whose framework rates it
    # does not scale, was predicted up to 62% slow). Noise only adds: the smaller of two,
    # taken some 30 s apart, at the start and at the end.
    early_slowdown = _sustained_slowdown(arithmetic, op_overhead)
    latency, bandwidth = _allreduce_fit()
    sharded_linear = min(_sharded_linear_overhead(latency, bandwidth) for _ in range(2))
    sequence_parallel = _sequence_parallel_overhead(latency, bandwidth)
    fsdp = _fsdp_overheads(latency, bandwidth)
    slowdown = min(early_slowdown, _sustained_slowdown(arithmetic, op_overhead))
    dist.barrier()  # no rank leaves while another still talks to it
    dist.destroy_process_group()
    if rank == 0:
        print(
            json.dumps(
                {
                    **arithmetic,
                    "op_overhead_s": op_overhead,
                    "allreduce_latency_s": latency,
                    "allreduce_bandwidth": bandwidth,
                    "sharded_linear_overhead_s": sharded_linear,
                    "sequence_parallel_overhead_s": sequence_parallel,
                    "fsdp_unit_overhead_s": fsdp.tensor_pass_s,
                    "fsdp_step_overhead_s": fsdp.unit_step_s,
                    "fsdp_tensor_overhead_s": fsdp.tensor_step_s,
                    "fsdp_gather_overhead_s": fsdp.unit_gather_s,
                    "sustained_slowdown": slowdown,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:4]))
