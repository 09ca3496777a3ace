"""Measure this machine's CPU as a planning target: matmul rate, memory bandwidth and
loopback TCP bandwidth (what gloo uses between local processes), in about a second.

Runs in the calling process only: two threads and a loopback socket, no workers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import socket
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from unipar.cluster.spec import ClusterSpec, DeviceSpec, LinkSpec, Precision


def _best_time(fn, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_matmul_flops(size: int = 512, threads: int = 1) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        return 2 * size**3 / _best_time(lambda: a @ b)
    finally:
        torch.set_num_threads(previous)


def measure_small_op_seconds() -> float:
    """Fixed cost of one tiny operation (dispatch overhead)."""
    x = torch.ones(8)
    return _best_time(lambda: [x.add(1) for _ in range(200)]) / 200


def measure_memory_bandwidth(megabytes: int = 64) -> float:
    src = torch.empty(megabytes * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / _best_time(lambda: dst.copy_(src))  # read + write


def measure_loopback_bandwidth(megabytes: int = 32) -> tuple[float, float]:
    """(bytes/s, round-trip latency s) of TCP over the loopback interface."""
    payload = b"\0" * (megabytes * 2**20)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            received = 0
            while received < len(payload):
                received += len(conn.recv(1 << 20))
            conn.sendall(b"k")
            conn.recv(1)
            conn.sendall(b"k")

    thread = threading.Thread(target=sink, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as client:
        start = time.perf_counter()
        client.sendall(payload)
        client.recv(1)
        bandwidth = len(payload) / (time.perf_counter() - start)
        start = time.perf_counter()
        client.sendall(b"k")
        client.recv(1)
        latency = time.perf_counter() - start
    thread.join()
    server.close()
    return bandwidth, latency


def calibrated_cpu_cluster(
    nodes: int = 1, devices_per_node: int = 2, *, cache_dir: Path | None = None
) -> ClusterSpec:
    """This machine as a cluster of ``devices_per_node`` single-thread CPU workers.

    Measured once per machine: the numbers are kept in ``cache_dir`` (default
    ``~/.cache/unipar``), keyed by host, core count and torch version."""
    device, link = _cached_measurement(cache_dir or Path.home() / ".cache" / "unipar")
    device = replace(device, memory_gib=device.memory_gib / devices_per_node)
    return ClusterSpec("cpu", nodes, devices_per_node, device, link, link)


def _cached_measurement(cache_dir: Path) -> tuple[DeviceSpec, LinkSpec]:
    key = f"{platform.node()}-{os.cpu_count()}-{torch.__version__}"
    path = cache_dir / f"cpu-calibration-{key}.json"
    try:
        data = json.loads(path.read_text())
        device = DeviceSpec(**{**data["device"], "precision": Precision(data["precision"])})
        return device, LinkSpec(**data["link"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: measure again
    device, link = _measure()
    record = {
        "device": {k: v for k, v in asdict(device).items() if k != "precision"},
        "precision": device.precision.value,
        "link": asdict(link),
    }
    with contextlib.suppress(OSError):  # a read-only home only costs a re-measurement
        cache_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
    return device, link


@functools.lru_cache(maxsize=1)
def _measure() -> tuple[DeviceSpec, LinkSpec]:
    flops = measure_matmul_flops()
    bandwidth, latency = measure_loopback_bandwidth()
    device = DeviceSpec(
        name="cpu-thread",
        memory_gib=_memory_gib(),
        peak_flops_16bit=flops,  # the CPU build has no faster 16-bit path to count on
        peak_flops_32bit=flops,
        memory_bandwidth=measure_memory_bandwidth(),
        gemm_efficiency=1.0,  # the peak above is itself a measured matmul rate
        kernel_overhead_s=measure_small_op_seconds(),
        reserved_gib=0.5,
        precision=Precision.FP32,  # CPU training runs in float32
    )
    return device, LinkSpec(bandwidth=bandwidth, latency_s=latency / 2)


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
