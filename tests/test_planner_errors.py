"""Bad planner input: each error names the rule, the values and a fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from unipar import ConfigError
from unipar.cluster import cluster_preset
from unipar.models import GPTConfig
from unipar.plan import Constraints, plan


def _gpt(**kw):
    base = dict(vocab_size=51200, seq_len=2048, hidden=4096, layers=8, heads=32)
    return GPTConfig(**{**base, **kw}).spec()


def test_heads_not_divisible_by_tp():
    with pytest.raises(ConfigError, match=r"`tp` must divide `heads`, but got tp=8, heads=12"):
        plan(
            _gpt(hidden=768, heads=12, layers=2),
            cluster_preset("a100-80g"),
            8,
            constraints=Constraints(tp=8),
        )


def test_tp_must_stay_within_a_node():
    with pytest.raises(ConfigError, match=r"devices_per_node=8; choose tp among \[1, 2, 4, 8\]"):
        plan(
            _gpt(heads=48, hidden=6144, layers=2),
            cluster_preset("a100-80g"),
            8,
            constraints=Constraints(tp=3),
        )


def test_more_devices_than_the_cluster():
    pattern = r"needs 64 devices \(tp=8 x pp=8\), but the cluster has 16"
    with pytest.raises(ConfigError, match=pattern):
        plan(_gpt(), cluster_preset("a100-80g", nodes=2), 64, constraints=Constraints(tp=8, pp=8))


def test_model_that_fits_under_no_plan():
    huge = _gpt(hidden=12288, layers=96, heads=96)  # 175B parameters on 8 GPUs
    with pytest.raises(ConfigError) as raised:
        plan(huge, cluster_preset("v100-16g"), 8)
    message = str(raised.value)
    assert "fits under no plan" in message and "GiB per device" in message
    assert "16.0 GiB available" in message and "more devices" in message


def test_unknown_preset():
    with pytest.raises(ConfigError, match=r"unknown cluster preset 'a100'; known presets: a100"):
        cluster_preset("a100")


def test_cli_reports_errors_without_a_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "unipar", "plan", "gpt", "--global-batch", "8", "--fix", "tp=x"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--fix takes key=value pairs" in done.stderr and "Traceback" not in done.stderr
