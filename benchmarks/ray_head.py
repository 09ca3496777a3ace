"""A Ray cluster of this machine started as a user starts one: ``ray start --head --block``,
in its own process group, stopped by signalling that process (never ``ray stop``, which
would end every Ray instance on the machine) and checked to leave no process behind.

Its processes know their own cluster: ``RAY_ADDRESS`` is in the environment the head
starts with, so a helper process that Ray Train or Tune starts and that looks for "the"
cluster finds this one, not another on the same machine. ``preload``: modules every worker
process imports as it starts (Ray's ``RAY_preload_python_modules``); empty: a stock cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_members(group: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(int(entry.name)) == group:
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def ray_head(num_cpus: int, *, preload: Sequence[str] = (), timeout_s: float = 180.0
             ) -> Iterator[str]:
    """Start the head; yield its address (``127.0.0.1:PORT``); stop it on exit."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_ADDRESS": address}
    if preload:
        env["RAY_preload_python_modules"] = ",".join(preload)
    command = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
               f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats",
               f"--system-config={json.dumps({'worker_niceness': 0})}", "--block"]
    with tempfile.TemporaryDirectory(prefix="ray-head-") as tmp:
        log = Path(tmp) / "head.log"
        with log.open("w") as out:
            head = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while "Ray runtime started" not in log.read_text():
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"`ray start --head` did not start:\n{log.read_text()}")
                time.sleep(0.5)
            yield address
        finally:
            head.send_signal(signal.SIGTERM)  # --block: the head stops its own processes
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(timeout=60)
            deadline = time.monotonic() + 30
            while (left := _group_members(head.pid)) and time.monotonic() < deadline:
                time.sleep(0.5)
            for pid in left:  # only processes of the group this head started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def wait_for_idle(cpus: float, timeout_s: float = 120.0) -> None:
    """Until ``cpus`` CPUs of the Ray instance this process joined are free (the previous
    run's actors and placement groups gone: under load their processes take seconds to
    exit), so that each side starts at its full size."""
    import ray  # deferred: the rest of this module runs without Ray imported

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster is still busy after {timeout_s:g} s: "
                               f"{ray.available_resources()}")
        time.sleep(0.5)
