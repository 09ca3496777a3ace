"""Measure this machine's CPU as a planning target: matmul rate, the rate of memory-bound
kernels, and, on two gloo worker processes, collectives and the framework's own cost per
operation (:mod:`unipar.runtime.calibrate_group`, run in its own processes: it measures
against the planner's cost model). Measured once, then cached.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from unipar.cluster.run_records import cache_dir as default_cache_dir
from unipar.cluster.run_records import machine_load
from unipar.cluster.spec import (
    AttentionKernel,
    ClusterSpec,
    Collectives,
    DeviceSpec,
    Kernels,
    LinkSpec,
    Precision,
)


def _sustained_time(fn, seconds: float = 0.5) -> float:  # type: ignore[no-untyped-def]
    """Median time of ``fn`` over about ``seconds`` of back-to-back calls: the rate a
    training loop sustains (clock and caches under load), not the best burst."""
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_matmul_flops(m: int = 512, k: int = 512, n: int = 512, threads: int = 1) -> float:
    """FLOP/s of a ``[m, k] @ [k, n]`` product, sustained."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(m, k), torch.randn(k, n)
        return 2 * m * k * n / _sustained_time(lambda: a @ b)
    finally:
        torch.set_num_threads(previous)


# Shapes of the products in small models' training (tokens x width x width, and the
# transposed products of the backward), whose median rate the calibration takes.
SMALL_MODEL_MATMULS = (
    (256, 256, 256),
    (512, 512, 512),
    (1024, 128, 512),
    (1024, 512, 128),
    (128, 1024, 512),
)


def measure_elementwise_bandwidth(megabytes: int = 4, threads: int = 1) -> float:
    """Bytes read and written per second by the memory-bound kernels of training (GELU,
    layer norm, softmax, add), forward and backward, on ``megabytes`` of float32: what
    the cost model's roofline uses for non-matmul ops, which on CPUs run well below the
    copy bandwidth."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = megabytes * 2**20 // 4 // 256
        x = torch.randn(rows, 256, requires_grad=True)
        norm = torch.nn.LayerNorm(256)

        def kernels() -> None:
            y = torch.nn.functional.gelu(x)
            y = norm(y) + x
            y = torch.softmax(y, dim=-1)
            y.sum().backward()

        seconds = _sustained_time(kernels)
        # Forward: 4 kernels of one read and one write (add: two reads); backward: about
        # twice the forward's traffic (Narayanan et al. 2021's 2x, applied to bytes).
        moved = 3 * (4 * 2 + 1) * x.numel() * 4
        return moved / seconds
    finally:
        torch.set_num_threads(previous)


def calibrated_cpu_cluster(
    nodes: int = 1, devices_per_node: int = 2, *, cache_dir: Path | None = None
) -> ClusterSpec:
    """This machine as a cluster of ``devices_per_node`` single-thread CPU workers.

    Measured once per machine (about 20 s: one process for arithmetic, then two gloo
    processes for collectives and the framework's per-operation costs) and kept in
    ``cache_dir`` (default ``~/.cache/unipar``) for :data:`MAX_AGE_S`, keyed by what the
    numbers depend on (:func:`machine`): another CPU, core count, memory size or torch
    version measures again."""
    device, link = _cached_measurement(cache_dir or default_cache_dir())
    device = replace(device, memory_gib=device.memory_gib / devices_per_node)
    about = machine()
    where = f"{about['host']}:{machine_key(about)}"
    return ClusterSpec("cpu", nodes, devices_per_node, device, link, link, machine=where)


_CACHE_VERSION = 16
MAX_AGE_S = 30 * 24 * 3600  # clocks, kernels and neighbours drift: measure monthly


def machine() -> dict[str, object]:
    """What a calibration depends on: the host, its CPU model and core count, memory,
    the torch build, and the calibration's own version."""
    return {
        "version": _CACHE_VERSION,
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": round(_memory_gib()),
        "torch": torch.__version__,
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def machine_key(about: dict[str, object]) -> str:
    """A digest of :func:`machine`'s answer: the key of its calibration."""
    return hashlib.sha256(json.dumps(about, sort_keys=True).encode()).hexdigest()[:16]


def cache_file(cache_dir: Path, about: dict[str, object]) -> Path:
    return cache_dir / f"cpu-calibration-{machine_key(about)}.json"


def read_record(
    path: Path, about: dict[str, object], now: float | None = None
) -> dict[str, Any] | None:
    """The cached record, if it was measured on this machine within MAX_AGE_S."""
    try:
        data = json.loads(path.read_text())
        age = (time.time() if now is None else now) - float(data["measured_at"])
        if data["machine"] != about or not 0 <= age <= MAX_AGE_S:
            return None
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measure again


def measurement_of(data: dict[str, Any]) -> tuple[DeviceSpec, LinkSpec] | None:
    """The device and link a cached record holds (``None``: not readable as one)."""
    try:
        device = DeviceSpec(
            **{
                **data["device"],
                "precision": Precision(data["precision"]),
                "attention": AttentionKernel(data["attention"]),
                "kernels": Kernels(data.get("kernels", Kernels.FUSED.value)),
                "collectives": Collectives(data["collectives"]),
            }
        )
        return device, LinkSpec(**data["link"])
    except (ValueError, KeyError, TypeError):
        return None  # written by another version: measure again


def read_cache(
    path: Path, about: dict[str, object], now: float | None = None
) -> tuple[DeviceSpec, LinkSpec] | None:
    """The cached measurement, if it was taken on this machine within MAX_AGE_S."""
    data = read_record(path, about, now)
    return None if data is None else measurement_of(data)


def write_cache(
    path: Path,
    about: dict[str, object],
    device: DeviceSpec,
    link: LinkSpec,
    load_before: float | None = None,
) -> None:
    """Keep a measurement; ``load_before``: the machine's load average when it began."""
    record = {
        "machine": about,
        "measured_at": time.time(),
        "load_before": load_before,
        "device": {
            k: v
            for k, v in asdict(device).items()
            if k not in ("precision", "attention", "kernels", "collectives")
        },
        "precision": device.precision.value,
        "attention": device.attention.value,
        "kernels": device.kernels.value,
        "collectives": device.collectives.value,
        "link": asdict(link),
    }
    with contextlib.suppress(OSError):  # a read-only home only costs a re-measurement
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))


# 46 s at load 0.4-1.7 on 2 cores, 55 s at 4-6 (FSDP timed at 1 and 3 micro-batches,
# ZeRO-2 and ZeRO-3; 22-31 s on idle cores before that); 45 s twice at load 0-2 with
# FSDP's rates taken once, in sustained pairs (2026-11-26)
CALIBRATION_TAKES_S = 45


def cached_load(data: dict[str, Any]) -> float | None:
    """The load average a cached record's measurement began at (``None``: not kept)."""
    try:
        load = data.get("load_before")
        return None if load is None else float(load)
    except (ValueError, TypeError):
        return None


def measured_busy_now_quiet(load_then: float | None, load_now: float, cpus: int) -> bool:
    """Whether a cached calibration should be measured again: it began while other work
    held the cores (load average above their count) and the machine is quiet now (at
    most half of them busy). One taken while the test suite ran beside it measured
    56.4 GFLOP/s per worker, 1.11 GB/s and 37 us per op where a quiet one had measured
    128.5, 9.96 and 13, and the next run of the demo's job was predicted 301% slow
    (docs/planner-learning.md)."""
    return load_then is not None and load_then > cpus and load_now <= cpus / 2


def _cached_measurement(cache_dir: Path) -> tuple[DeviceSpec, LinkSpec]:
    about = machine()
    path = cache_file(cache_dir, about)
    data = read_record(path, about)
    cached = None if data is None else measurement_of(data)
    load_now, cpus = machine_load()
    load_then = None if data is None else cached_load(data)
    if cached is not None and not measured_busy_now_quiet(load_then, load_now, cpus):
        return cached
    why = (
        "once per machine"
        if cached is None
        else f"again: the cached one began at load {load_then:.1f} on {cpus} cores, "
        f"the machine is quiet now ({load_now:.1f})"
    )
    print(
        f"unipar: calibrating this machine's CPU for the planner ({why}, "
        f"~{CALIBRATION_TAKES_S} s; cached in {path.parent})",
        file=sys.stderr,
        flush=True,
    )
    device, link = _measure()
    write_cache(path, about, device, link, load_before=load_now)
    return device, link


@functools.lru_cache(maxsize=1)
def _measure() -> tuple[DeviceSpec, LinkSpec]:
    group = measure_group()
    # Short measurements of single rates, scaled by what sustained training on every
    # worker at once takes beyond them (a reference network's measured/predicted time).
    slowdown = group["sustained_slowdown"]
    flops = group["matmul_flops"] / slowdown  # median over the shapes small models use
    device = DeviceSpec(
        name="cpu-thread",
        memory_gib=_memory_gib(),
        peak_flops_16bit=flops,  # the CPU build has no faster 16-bit path to count on
        peak_flops_32bit=flops,
        memory_bandwidth=group["elementwise_bandwidth"] / slowdown,
        optimizer_bandwidth=group["optimizer_bandwidth"] / slowdown,
        gemm_efficiency=1.0,  # the peak above is itself a measured matmul rate
        kernel_overhead_s=group["op_overhead_s"] * slowdown,
        reserved_gib=0.5,
        precision=Precision.FP32,  # CPU training runs in float32
        sharded_op_overhead_s=group["sharded_linear_overhead_s"],
        sequence_parallel_op_overhead_s=group["sequence_parallel_overhead_s"],
        fsdp_unit_overhead_s=group["fsdp_unit_overhead_s"],
        fsdp_step_overhead_s=group["fsdp_step_overhead_s"],
        fsdp_tensor_overhead_s=group["fsdp_tensor_overhead_s"],
        fsdp_gather_overhead_s=group["fsdp_gather_overhead_s"],
        collectives=Collectives.GLOO,
        overlaps_communication=False,
    )
    link = LinkSpec(bandwidth=group["allreduce_bandwidth"], latency_s=group["allreduce_latency_s"])
    return device, link


def measure_group(world: int = 2, timeout_s: float = 300) -> dict[str, float]:
    """Run :mod:`unipar.runtime.calibrate_group` on ``world`` local processes."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "unipar.runtime.calibrate_group"]
    others = [
        subprocess.Popen(
            [*command, str(rank), str(world), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in range(1, world)
    ]
    try:
        done = subprocess.run(
            [*command, "0", str(world), str(port)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    finally:
        for process in others:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            process.kill()
    if done.returncode != 0:
        raise RuntimeError(f"calibrating {world} CPU workers failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
