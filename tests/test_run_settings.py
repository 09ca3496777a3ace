"""Run settings: one declaration (RunConfig) behind fit and the command line; default
run directories that never collide; resources that other jobs hold are waited for,
visibly, then refused with what is free."""

from __future__ import annotations

import inspect
import re
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from unipar import ConfigError, ResourceError, fit
from unipar.cli.main import build_parser
from unipar.cli.train import run_options
from unipar.plan import Strategy
from unipar.ray_cluster.session import reserve_bundles
from unipar.runtime.config import RunConfig, cli_fields, default_run_dir


def test_fit_takes_a_run_config_and_its_fields_by_name():
    parameters = inspect.signature(fit).parameters
    assert list(parameters) == ["job", "config", "callbacks", "size_target", "settings"]
    assert parameters["settings"].kind is inspect.Parameter.VAR_KEYWORD
    config = RunConfig(workers=3, keep_checkpoints=5).replace(workers=(1, 4), max_failures=0)
    assert (config.min_workers, config.workers, config.keep_checkpoints) == (1, 4, 5)
    assert config.max_failures == 0
    with pytest.raises(ConfigError, match="but got worker; check the spelling"):
        RunConfig().replace(worker=2)


def test_a_new_run_setting_is_one_field():
    """A field with CLI metadata is a `unipar train` flag, a keyword of fit (through
    RunConfig.replace) and, when marked, an option of `submit`: nowhere else to add it."""
    from unipar.cli.train import add_run_options
    from unipar.runtime.config import submit_fields

    parser = __import__("argparse").ArgumentParser()
    add_run_options(parser)
    flags = {action.dest for action in parser._actions} - {"help"}
    assert flags == {f.name for f in cli_fields()}
    assert set(submit_fields()) == {
        "snapshot_every", "checkpoint_every", "keep_checkpoints", "max_failures",
    }


def test_every_flag_reaches_fit_under_its_field_name():
    every = [
        *("train", "job.py", "--workers", "3", "--cpus-per-worker", "2", "--gpus-per-worker"),
        *("0.5", "--run-dir", "r", "--checkpoint-dir", "c", "--checkpoint-every", "7"),
        *("--keep-checkpoints", "4", "--resume", "--max-failures", "0", "--no-progress"),
        *("--placement-timeout", "9", "--no-elastic", "--snapshot-every", "5"),
        *("--collective-timeout", "30"),
        *("--trace", "3", "--strategy", "fsdp", "--address", "10.0.0.5:6379"),
    ]
    options = run_options(build_parser().parse_args(every))
    assert set(options) == {f.name for f in cli_fields()}
    config = RunConfig(**options)
    assert (config.workers, config.cpus_per_worker, config.gpus_per_worker) == (3, 2.0, 0.5)
    assert (config.run_dir, config.checkpoint_dir, config.resume) == (Path("r"), Path("c"), True)
    assert (config.checkpoint_every, config.keep_checkpoints, config.max_failures) == (7, 4, 0)
    assert config.progress is False and config.placement_timeout_s == 9.0
    assert config.collective_timeout_s == 30.0
    assert config.elastic is False and config.snapshot_every == 5
    assert config.trace_steps == 3
    assert config.plan is Strategy.FSDP and config.address == "10.0.0.5:6379"
    # left out, a flag keeps fit's default; the command line plans by default
    assert run_options(build_parser().parse_args(["train"])) == {"plan": "auto"}
    assert {f.name for f in fields(RunConfig)} - set(options) == {
        "min_workers",  # set by --workers MIN:MAX
        "poll_interval_s",
    }


def test_a_worker_range_flag_sets_the_fewest_and_the_most():
    from unipar.cli.train import run_config

    options = run_options(build_parser().parse_args(["train", "--workers", "2:3"]))
    assert options == {"workers": (2, 3), "plan": "auto"}  # fit takes the range as it is
    config = run_config(options)
    assert (config.min_workers, config.workers, config.least_workers) == (2, 3, 2)


def test_default_run_dirs_started_in_the_same_second_differ():
    first, second = default_run_dir("job"), default_run_dir("job")
    assert first != second
    pattern = r"job-\d{8}-\d{6}-[0-9a-f]{6}"
    assert re.fullmatch(pattern, first.name) and re.fullmatch(pattern, second.name)


@pytest.fixture
def three_cpus_held(ray_cluster):
    """Another job holding 3 of the 4 CPUs."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 3}])
    ray_cluster.get(group.ready(), timeout=60)
    yield group
    remove_placement_group(group)


def test_busy_resources_are_waited_for_visibly_then_refused(three_cpus_held, capsys):
    started = time.monotonic()
    with pytest.raises(ResourceError) as raised:
        reserve_bundles({"CPU": 1}, 2, "worker", timeout_s=2, notice_after_s=0.5)
    assert time.monotonic() - started < 10
    waited = capsys.readouterr().err
    assert re.search(r"waiting up to 2 s for 2 CPUs \(1 free of 4\): other jobs hold", waited)
    message = str(raised.value)
    assert "the cluster has 2 CPUs (1 free of 4)" in message and "--placement-timeout" in message


def test_a_run_starts_once_the_resources_are_freed(three_cpus_held, capsys):
    from ray.util.placement_group import remove_placement_group

    threading.Timer(1.5, remove_placement_group, args=(three_cpus_held,)).start()
    group = reserve_bundles({"CPU": 1}, 2, "worker", timeout_s=60, notice_after_s=0.5)
    remove_placement_group(group)
    assert "waiting up to 60 s for 2 CPUs" in capsys.readouterr().err


def test_a_gang_short_of_room_says_it_waits_then_is_refused(three_cpus_held, tmp_path, capsys):
    from unipar.testing import tiny_gpt_job

    started = time.monotonic()
    with pytest.raises(ResourceError, match="fewer than min_workers=2"):
        fit(tiny_gpt_job(steps=2), workers=2, run_dir=tmp_path, placement_timeout_s=2,
            progress=False, elastic=False)
    assert time.monotonic() - started < 30
    assert re.search(r"waiting up to 2 s for 2 CPUs \(1 free of 4\): other jobs hold",
                     capsys.readouterr().err)
