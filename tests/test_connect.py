"""Joining a Ray cluster: a wrong address fails within seconds, saying what was tried and
how to start a cluster; a cluster of another Ray version says so."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from unipar import ResourceError
from unipar.cli.main import main
from unipar.ray_cluster.address import check_cluster, check_versions, cluster_versions

JOB_FILE = "from unipar.testing import tiny_gpt_job\n\njob = tiny_gpt_job(steps=4)\n"
CXX_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [IWEF] \d+ \d+\]", re.MULTILINE)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_service():
    """A TCP server that accepts connections and never answers (not Ray)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection, _ in held:
        connection.close()


def _train(address, tmp_path, monkeypatch, capsys):
    import ray

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB_FILE)
    was_running = ray.is_initialized()
    started = time.monotonic()
    code = main(["train", "job.py", "--address", address, "--no-progress"])
    elapsed = time.monotonic() - started
    assert ray.is_initialized() == was_running  # Ray was neither started nor joined
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]
    return code, capsys.readouterr().err, elapsed


def test_unreachable_address_fails_within_15_s(tmp_path, monkeypatch, capsys):
    port = _closed_port()
    code, err, elapsed = _train(f"127.0.0.1:{port}", tmp_path, monkeypatch, capsys)
    assert code == 2 and elapsed < 15
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err
    assert "Connection refused" in err and f"ray start --head --port={port}" in err


def test_a_service_that_is_not_ray_fails_within_15_s(silent_service, tmp_path, monkeypatch, capsys):
    code, err, elapsed = _train(silent_service, tmp_path, monkeypatch, capsys)
    assert code == 2 and elapsed < 15
    assert f"something listens at {silent_service} but it is not a Ray cluster's head" in err


def test_unreachable_address_from_the_command_line(tmp_path):
    """The real command: one line on stderr, no traceback, no C++ retry log, < 15 s."""
    (tmp_path / "job.py").write_text(JOB_FILE)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unipar",
            "train",
            "job.py",
            "--address",
            f"127.0.0.1:{_closed_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert time.monotonic() - started < 15
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("unipar: error: cannot reach")
    assert not CXX_LOG_LINE.search(done.stderr) and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]


def test_a_live_cluster_passes_every_probe(ray_cluster):
    address = ray_cluster.get_runtime_context().gcs_address
    assert check_cluster(address) == address
    assert cluster_versions(address)["ray_version"] == ray_cluster.__version__


def test_a_cluster_of_another_ray_version_says_so(ray_cluster):
    address = ray_cluster.get_runtime_context().gcs_address
    theirs = {**cluster_versions(address), "ray_version": "2.9.3"}
    pattern = rf"runs Ray 2\.9\.3 .* this process has Ray {re.escape(ray_cluster.__version__)}"
    with pytest.raises(ResourceError, match=pattern + r".*install ray==2\.9\.3"):
        check_versions(address, theirs)
