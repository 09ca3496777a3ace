"""Workers on different Ray nodes join one process group and train."""

from __future__ import annotations

from own_cluster import run_scenario
from reference_loop import single_process_losses

from unipar.testing import tiny_gpt_job


def test_workers_on_two_nodes(tmp_path):
    outcome, _ = run_scenario("multinode_run.py", tmp_path)
    assert outcome["nodes"] == 2
    expected, _ = single_process_losses(tiny_gpt_job(steps=6))
    assert max(abs(a - b) / b for a, b in zip(outcome["losses"], expected, strict=True)) < 1e-5
