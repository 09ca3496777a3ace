"""Workers on different Ray nodes join one process group and train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from reference_loop import single_process_losses

from unipar.testing import tiny_gpt_job


def test_workers_on_two_nodes(tmp_path):
    script = Path(__file__).with_name("multinode_run.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["nodes"] == 2
    expected, _ = single_process_losses(tiny_gpt_job(steps=6))
    assert max(abs(a - b) / b for a, b in zip(outcome["losses"], expected, strict=True)) < 1e-5
