"""Joining a cluster that ``ray start --head`` started, as a newcomer does: Ray 2.60 turns
token authentication on there (a token exists once any local Ray has run), and unipar's
commands join it with no environment variable set by hand.

The second head runs as ``ray start --head --block`` in its own process group and is
stopped by signalling that process (never ``ray stop``, which would end this session's
own Ray too); the test then checks that none of its processes is left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
JOB_FILE = "from unipar.testing import tiny_gpt_job\n\njob = tiny_gpt_job(steps={steps})\n"
TOKEN_FILE = Path.home() / ".ray" / "auth_token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _newcomer_env() -> dict[str, str]:
    """This process's environment less what Ray set in it for the session's own cluster
    (a newcomer's shell has no RAY_AUTH_MODE)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def _group_members(group: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    found.append(int(entry.name))
            except ProcessLookupError:
                continue
    return found


@pytest.fixture(scope="module")
def second_head(ray_cluster, tmp_path_factory):
    """A real Ray head started by ``ray start --head --port P --block``, under the token
    authentication Ray turns on by default where a token exists."""
    assert TOKEN_FILE.is_file(), "the session's local Ray writes Ray's token file"
    port = _free_port()
    log = tmp_path_factory.mktemp("head") / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats", "--block"],
            stdout=out, stderr=subprocess.STDOUT, env=_newcomer_env(), start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert "Token authentication is enabled" in log.read_text()
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # --block: the head stops its own processes
        try:
            head.wait(timeout=30)
        finally:
            deadline = time.monotonic() + 30
            while (left := _group_members(head.pid)) and time.monotonic() < deadline:
                time.sleep(0.5)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
    assert not left, f"the second head left processes {left}"


def _unipar(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "unipar"), *args], cwd=cwd, env=_newcomer_env(), capture_output=True,
        text=True, timeout=timeout,
    )


def test_train_joins_a_ray_start_cluster(second_head, tmp_path):
    (tmp_path / "job.py").write_text(JOB_FILE.format(steps=4))
    done = _unipar("train", "job.py", "--address", second_head, "--strategy", "ddp",
                   "--workers", "2", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "unipar run summary" in done.stdout
    assert "over 4 steps" in done.stdout


def test_shared_cluster_commands_join_a_ray_start_cluster(second_head, tmp_path):
    (tmp_path / "job.py").write_text(JOB_FILE.format(steps=6))
    where = ["--address", second_head]
    state = ["--state-dir", str(tmp_path / "state")]
    up = _unipar("up", *where, *state, "--interval", "0.5", cwd=tmp_path)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        submitted = _unipar("submit", "job.py", "--workers", "1:2", *where, cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        assert "submitted job 1" in submitted.stdout
        deadline = time.monotonic() + 180
        while True:
            table = _unipar("jobs", *where, cwd=tmp_path)
            assert table.returncode == 0, table.stderr[-3000:]
            if " done " in table.stdout or time.monotonic() > deadline:
                break
            assert " failed " not in table.stdout, table.stdout
            time.sleep(2)
        assert " done " in table.stdout and "6/6 (100%)" in table.stdout, table.stdout
    finally:
        down = _unipar("down", *where, cwd=tmp_path)
    assert down.returncode == 0, down.stderr[-3000:]
    assert "scheduler and its jobs stopped" in down.stdout


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RAY_AUTH_TOKEN": "0" * 32}, "refused this machine's token (from RAY_AUTH_TOKEN)"),
        ({"HOME": "{tmp}"}, "requires token authentication, but this machine has no token"),
        ({"RAY_AUTH_MODE": "disabled"}, "but RAY_AUTH_MODE=disabled is set here"),
    ],
    ids=["wrong-token", "no-token", "auth-disabled-here"],
)
def test_a_refused_token_names_what_to_set(second_head, tmp_path, env, says):
    (tmp_path / "job.py").write_text(JOB_FILE.format(steps=2))
    environment = _newcomer_env() | {k: v.format(tmp=tmp_path) for k, v in env.items()}
    done = subprocess.run(
        [str(BIN / "unipar"), "train", "job.py", "--address", second_head, "--no-progress"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("unipar: error: the Ray cluster at " + second_head)
    assert says in error and "~/.ray/auth_token" in error
    assert not (tmp_path / "unipar_runs").exists()
