"""Run a scenario script that needs its own Ray cluster (fake nodes from
``ray.cluster_utils.Cluster``) in a subprocess: the test session's Ray stays as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_scenario(script: str, workdir: Path, timeout_s: int = 300) -> tuple[dict[str, Any], str]:
    """Run ``tests/<script> <workdir>``; return the JSON object its last output line
    holds, and its standard error. Fails the test with the script's error if it fails."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script)), str(workdir)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
