"""Bad input: every ``unipar`` flag and every ``Job``/``fit`` field, given a bad value,
gets one clear error (the rule, the value, a fix) with no traceback, before Ray starts
and before anything is written; nothing already on disk is overwritten."""

from __future__ import annotations

import hashlib
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unipar import (
    CheckpointError,
    ConfigError,
    Job,
    LRSchedule,
    OptimizerSpec,
    ResourceError,
    UniparError,
    UserCodeError,
    fit,
)
from unipar.adapt import AdaptiveBatch
from unipar.cli.main import main
from unipar.job import cross_entropy_loss
from unipar.plan import GradSync, Mesh, Plan
from unipar.testing import tiny_gpt_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the failing loss below

JOB_FILE = "from unipar.testing import tiny_gpt_job\n\njob = tiny_gpt_job(steps=4)\n"
SUM_LOSS_JOB_FILE = """from dataclasses import replace
import torch
from unipar.testing import tiny_gpt_job

def summed(outputs, targets):
    logits = outputs.reshape(-1, outputs.size(-1))
    return torch.nn.functional.cross_entropy(logits, targets.reshape(-1), reduction="sum")

job = replace(tiny_gpt_job(steps=4), loss=summed)
"""
FACTORY_OPTIMIZER_JOB_FILE = """from dataclasses import replace
import torch
from unipar.testing import tiny_gpt_job

job = replace(tiny_gpt_job(steps=4), optimizer=torch.optim.SGD)
"""


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class RayStarted(AssertionError):
    pass


@pytest.fixture
def no_ray(monkeypatch):
    """Any attempt to start or join Ray fails the test: validation alone must answer."""
    import importlib

    fit_module = importlib.import_module("unipar.runtime.run")  # the module, not fit()

    def refuse(*args, **kwargs):
        raise RayStarted("Ray was started although validation alone could answer")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(fit_module, "ray_session", refuse)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory holding a valid job file and a plain file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB_FILE)
    (tmp_path / "afile").write_text("a file, not a directory")
    return tmp_path


def _cli(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors (not an int, unknown choice)
        code = exit_.code
    return code, capsys.readouterr().err


def _assert_one_clear_error(code, err):
    assert code == 2, err
    assert "Traceback" not in err and 'File "' not in err, err
    assert sum("error:" in line for line in err.splitlines()) == 1, err


def _nothing_written(workdir: Path) -> None:
    assert {p.name for p in workdir.iterdir()} <= {
        "afile",
        "job.py",
        "bad.json",
        "ps.json",
        "sum_loss.py",
        "factory_optimizer.py",
    }


# --- every flag of `unipar train` ----------------------------------------------------

TRAIN_FLAGS = [
    (["no-such-recipe"], "neither a built-in recipe"),
    (["job.py", "--workers", "0"], "--workers must be >= 1, but got 0"),
    (["job.py", "--workers", "two"], "takes a number or a range MIN:MAX"),
    (["job.py", "--workers", "4:2"], "the fewest workers must not exceed the most"),
    (["job.py", "--workers", "1:2", "--no-elastic"], "a worker range .* needs elastic"),
    (["job.py", "--no-elastic=yes"], "ignored explicit argument"),
    (["job.py", "--snapshot-every", "-1"], "--snapshot-every must be >= 0"),
    (["job.py", "--trace", "0"], "--trace must be >= 1, but got 0"),
    (["job.py", "--steps", "5", "--trace", "9"], r"--trace\) must be between 1 and the 5 step"),
    (["job.py", "--strategy", "zero4"], "strategy must be one of auto, ddp"),
    (["job.py", "--strategy", "missing.json"], "cannot read the plan file"),
    (["job.py", "--strategy", "bad.json"], r"not valid JSON: .* at line 2, column 20"),
    (["job.py", "--address", "localhost"], "address must be HOST:PORT"),
    (["job.py", "--address", "10.0.0.1:99999"], "address must be HOST:PORT"),
    (["job.py", "--steps", "0"], "--steps must be >= 1, but got 0"),
    (["job.py", "--run-dir", "afile"], "--run-dir afile is a file"),
    (["job.py", "--run-dir", "afile/run"], "afile is a file"),
    (["job.py", "--checkpoint-dir", "afile/ckpt"], "afile is a file"),
    (["job.py", "--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
    (["job.py", "--keep-checkpoints", "0"], "--keep-checkpoints must be >= 1"),
    (["job.py", "--resume", "no-such-checkpoint"], "no checkpoint at no-such-checkpoint"),
    (["job.py", "--run-dir", "fresh", "--resume"], "no checkpoint at fresh/checkpoints"),
    (["job.py", "--cpus-per-worker", "-1"], "--cpus-per-worker must be >= 0"),
    (["job.py", "--cpus-per-worker", "nan"], "--cpus-per-worker must be a finite number"),
    (["job.py", "--cpus-per-worker", "0"], "a worker needs a CPU or a GPU"),
    (["job.py", "--gpus-per-worker", "-1"], "--gpus-per-worker must be >= 0"),
    (["job.py", "--gpus-per-worker", "1.5"], "above 1 must be a whole number"),
    (["job.py", "--max-failures", "-1"], "--max-failures must be >= 0"),
    (["job.py", "--no-progress=yes"], "ignored explicit argument"),
    (["job.py", "--placement-timeout", "0"], "--placement-timeout must be > 0"),
    (["job.py", "--collective-timeout", "-1"], "--collective-timeout must be > 0"),
    (["job.py", "--max-batch", "64"], "--max-batch 64 without --adaptive-batch"),
    (["job.py", "--adaptive-batch", "--max-batch", "0"], "--max-batch must be >= 1"),
    (
        ["job.py", "--adaptive-batch", "--max-batch", "4"],
        r"max_global_batch must be at least .* M0\), but got max_global_batch=4 < "
        r"global_batch_size=8; .*--max-batch",
    ),
    (["sum_loss.py", "--adaptive-batch"], "needs a loss that is a mean over samples"),
    (["factory_optimizer.py", "--adaptive-batch"], "Job.optimizer is a factory with no rule"),
]


@pytest.mark.parametrize(
    ("argv", "pattern"), TRAIN_FLAGS, ids=[" ".join(a) for a, _ in TRAIN_FLAGS]
)
def test_train_flag(argv, pattern, workdir, no_ray, capsys):
    (workdir / "bad.json").write_text('{"mesh": {"dp": 2},\n "microbatch_size" 4}')
    (workdir / "sum_loss.py").write_text(SUM_LOSS_JOB_FILE)
    (workdir / "factory_optimizer.py").write_text(FACTORY_OPTIMIZER_JOB_FILE)
    _refused(["train", *argv], pattern, workdir, capsys)


def _refused(argv, pattern, workdir, capsys):
    code, err = _cli(argv, capsys)
    _assert_one_clear_error(code, err)
    assert re.search(pattern, err), err
    _nothing_written(workdir)


def test_job_file_with_a_syntax_error_is_one_line_before_ray(workdir, no_ray, capsys):
    (workdir / "job.py").write_text("from unipar.testing import tiny_gpt_job\njob = (\n")
    code, err = _cli(["train", "job.py"], capsys)
    _assert_one_clear_error(code, err)
    assert "job.py, line 2" in err and "SyntaxError: '(' was never closed" in err
    assert "unipar/" not in err


# --- every flag of `unipar plan` -----------------------------------------------------

PLAN_FLAGS = [
    (["bert"], "the model must be one of .* or hf:PATH/config.json, but got 'bert'"),
    (["gpt", "--hidden", "0"], "--hidden must be >= 1"),
    (["gpt", "--layers", "0"], "--layers must be >= 1, but got 0"),
    (["gpt", "--heads", "0"], "--heads must be >= 1"),
    (["gpt", "--heads", "5"], "hidden must be divisible by heads"),
    (["llama", "--kv-heads", "0"], "--kv-heads must be >= 1"),
    (["llama", "--ffn-hidden", "-4"], "--ffn-hidden must be >= 1"),
    (["gpt", "--vocab", "0"], "--vocab must be >= 1"),
    (["gpt", "--seq", "0"], "--seq must be >= 1, but got 0"),
    (["gpt", "--dropout", "1.5"], "--dropout must be < 1"),
    (["gpt", "--untied-embeddings=no"], "ignored explicit argument"),
    (["mlp", "--in-features", "0"], "--in-features must be >= 1"),
    (["mlp", "--out-features", "0"], "--out-features must be >= 1"),
    (["gpt", "--global-batch", "0"], "--global-batch must be >= 1"),
    (["gpt", "--global-batch", "x"], "invalid int value"),
    (["gpt", "--cluster", "a100"], "unknown cluster preset 'a100'"),
    (["gpt", "--nodes", "0"], "--nodes must be >= 1"),
    (["gpt", "--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    (["gpt", "--fix", "tp=x"], "--fix takes key=value pairs"),
    (["gpt", "--json=1"], "ignored explicit argument"),
    (["gpt", "--as-specified=yes"], "ignored explicit argument"),
    (["gpt", "--plot", "afile"], "is a file"),
    (["gpt", "--attention", "fast"], "invalid choice"),
    (["gpt", "--kernels", "slow"], "invalid choice"),
    (["gpt", "--versus", "tp=x"], "takes key=value pairs"),
]


@pytest.mark.parametrize(("argv", "pattern"), PLAN_FLAGS, ids=[" ".join(a) for a, _ in PLAN_FLAGS])
def test_plan_flag(argv, pattern, workdir, no_ray, capsys):
    if "--global-batch" not in argv:
        argv = [*argv, "--global-batch", "8"]
    _refused(["plan", *argv], pattern, workdir, capsys)


@pytest.mark.parametrize(("command", "table"), [("train", TRAIN_FLAGS), ("plan", PLAN_FLAGS)])
def test_every_flag_has_a_bad_value_in_the_tables(command, table):
    from unipar.cli.main import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command")
    flags = {a.option_strings[0] for a in commands.choices[command]._actions if a.option_strings}
    tried = {word.split("=")[0] for argv, _ in table for word in argv}
    assert flags - {"-h"} <= tried


def test_plan_without_global_batch(workdir, capsys):
    code, err = _cli(["plan", "gpt"], capsys)
    _assert_one_clear_error(code, err)
    assert "--global-batch" in err


# --- every field of Job, OptimizerSpec, LRSchedule -----------------------------------

_GOOD = tiny_gpt_job()


def _job(**changes):
    fields = {name: getattr(_GOOD, name) for name in _GOOD.__dataclass_fields__}
    return Job(**{**fields, **changes})


JOB_FIELDS = [
    ({"model": 5}, "Job.model must be callable"),
    ({"dataset": "tokens.bin"}, "Job.dataset must be callable"),
    ({"global_batch_size": 0}, "Job.global_batch_size must be >= 1, but got 0"),
    ({"global_batch_size": 8.0}, "Job.global_batch_size must be a whole number"),
    ({"steps": 0}, "Job.steps must be >= 1"),
    ({"steps": True}, "Job.steps must be a whole number"),
    ({"loss": None}, "Job.loss must be callable"),
    ({"optimizer": "adamw"}, "Job.optimizer must be callable"),
    ({"lr_schedule": "cosine"}, "Job.lr_schedule must be an LRSchedule"),
    ({"seed": -1}, "Job.seed must be >= 0"),
    ({"seed": 2**32}, "Job.seed must be <= 4294967295"),
    ({"name": "../escape"}, "Job.name must be 1-100 letters"),
    ({"name": ""}, "Job.name must be 1-100 letters"),
    ({"grad_clip_norm": 0.0}, "Job.grad_clip_norm must be > 0"),
    ({"grad_clip_norm": math.nan}, "Job.grad_clip_norm must be a finite number"),
    ({"adaptive": 64}, "Job.adaptive must be an AdaptiveBatch"),
    (
        {"adaptive": AdaptiveBatch(4)},
        r"max_global_batch must be at least .* M0\), but got "
        "max_global_batch=4 < global_batch_size=8",
    ),
    (
        {"adaptive": AdaptiveBatch(64, min_global_batch=16)},
        r"min_global_batch must be at most .* M0, where the run starts\), but got "
        "min_global_batch=16 > global_batch_size=8",
    ),
    (
        {"adaptive": AdaptiveBatch(64, "adascale")},
        "lr_rule='adascale' has no meaning for optimizer 'adamw'",
    ),
    (
        {"adaptive": AdaptiveBatch(64), "optimizer": torch.optim.Adam},
        "Job.optimizer is a factory with no rule",
    ),
    (
        {"adaptive": AdaptiveBatch(64), "optimizer": OptimizerSpec("adagrad")},
        "Job.optimizer is adagrad with no rule",
    ),
    ({"call": "keyword"}, r"Job.call must be one of 'positional', 'kwargs' \(ModelCall\)"),
    ({"collate": 3}, r"Job.collate must be callable"),
    ({"step": "mine"}, r"Job.step must be callable"),
    (
        {"step": lambda model, batch, ctx: model(batch[0]).mean(), "adaptive": AdaptiveBatch(64)},
        "an adaptive batch checks that the job's loss is a mean over samples",
    ),
]


def _field_id(changes: dict) -> str:
    """A test id that is the same in every process (a function's repr holds its address,
    which differs between pytest-xdist's workers)."""
    return str({k: getattr(v, "__name__", v) if callable(v) else v for k, v in changes.items()})


@pytest.mark.parametrize(
    ("changes", "pattern"), JOB_FIELDS, ids=[_field_id(c) for c, _ in JOB_FIELDS]
)
def test_job_field(changes, pattern):
    with pytest.raises(ConfigError, match=pattern) as raised:
        _job(**changes)
    assert "\n" not in str(raised.value)


def test_every_job_field_has_a_bad_value_above():
    assert {name for changes, _ in JOB_FIELDS for name in changes} == set(Job.__dataclass_fields__)


OPTIMIZER_FIELDS = [
    ({"kind": "rmsprop"}, r"OptimizerSpec.kind must be one of 'adamw', 'adam', 'sgd'"),
    ({"lr": 0.0}, "OptimizerSpec.lr must be > 0"),
    ({"lr": math.inf}, "OptimizerSpec.lr must be a finite number"),
    ({"weight_decay": -0.1}, "OptimizerSpec.weight_decay must be >= 0"),
    ({"betas": (0.9,)}, r"OptimizerSpec.betas must be a pair"),
    ({"betas": (0.9, 1.0)}, r"OptimizerSpec.betas\[1\] must be < 1"),
    ({"momentum": -1}, "OptimizerSpec.momentum must be >= 0"),
    ({"eps": 0.0}, "OptimizerSpec.eps must be > 0"),
]
SCHEDULE_FIELDS = [
    ({"kind": "zigzag"}, "LRSchedule.kind must be one of 'constant'"),
    ({"warmup_steps": -1}, "LRSchedule.warmup_steps must be >= 0"),
    ({"min_ratio": 1.5}, "LRSchedule.min_ratio must be <= 1"),
]


@pytest.mark.parametrize(
    ("cls", "changes", "pattern"),
    [(OptimizerSpec, c, p) for c, p in OPTIMIZER_FIELDS]
    + [(LRSchedule, c, p) for c, p in SCHEDULE_FIELDS],
)
def test_optimizer_and_schedule_field(cls, changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        cls(**changes)


def test_every_optimizer_and_schedule_field_has_a_bad_value_above():
    assert {n for c, _ in OPTIMIZER_FIELDS for n in c} == set(OptimizerSpec.__dataclass_fields__)
    assert {n for c, _ in SCHEDULE_FIELDS for n in c} == set(LRSchedule.__dataclass_fields__)


ADAPTIVE_FIELDS = [
    ({"max_global_batch": 0}, "AdaptiveBatch.max_global_batch must be >= 1"),
    ({"lr_rule": "linear"}, "AdaptiveBatch.lr_rule must be one of 'adascale'"),
    ({"adapt_every": 0}, "AdaptiveBatch.adapt_every must be >= 1"),
    ({"smoothing": 1.0}, "AdaptiveBatch.smoothing must be < 1"),
    ({"max_local_batch": 0}, "AdaptiveBatch.max_local_batch must be >= 1"),
    ({"min_global_batch": 0}, "AdaptiveBatch.min_global_batch must be >= 1"),
]


@pytest.mark.parametrize(("changes", "pattern"), ADAPTIVE_FIELDS)
def test_adaptive_batch_field(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        AdaptiveBatch(**{"max_global_batch": 64, **changes})


def test_every_adaptive_batch_field_has_a_bad_value_above():
    assert {n for c, _ in ADAPTIVE_FIELDS for n in c} == set(AdaptiveBatch.__dataclass_fields__)


def test_enum_fields_take_their_values_as_strings():
    assert OptimizerSpec(kind="sgd").kind.value == "sgd"
    assert LRSchedule(kind="warmup_cosine").kind.value == "warmup_cosine"


@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["global_batch_size", "steps"]),
    value=st.integers(max_value=0),
)
def test_job_sizes_below_one(field, value):
    with pytest.raises(ConfigError, match=f"Job.{field} must be >= 1, but got {value}"):
        _job(**{field: value})


@settings(max_examples=40, deadline=None)
@given(lr=st.floats(max_value=0.0) | st.just(math.nan) | st.just(-math.inf))
def test_learning_rates_that_are_not_positive(lr):
    with pytest.raises(ConfigError, match=r"OptimizerSpec\.lr must be"):
        OptimizerSpec(lr=lr)


# --- every argument of fit -----------------------------------------------------------

FIT_ARGUMENTS = [
    ({"job": "my_job.py"}, ConfigError, "job must be a unipar.Job"),
    ({"workers": 0}, ConfigError, "workers must be >= 1, but got 0"),
    ({"workers": "2"}, ConfigError, "workers must be a whole number"),
    ({"workers": (1, 2, 3)}, ConfigError, "workers must be a number or a range"),
    ({"workers": (3, 2)}, ConfigError, "the fewest workers must not exceed the most"),
    ({"workers": (0, 2)}, ConfigError, "min_workers must be >= 1"),
    ({"elastic": "yes"}, ConfigError, "elastic must be True or False"),
    ({"workers": (1, 2), "elastic": False}, ConfigError, "a worker range .* needs elastic"),
    ({"snapshot_every": -1}, ConfigError, "snapshot_every must be >= 0"),
    ({"trace_steps": 0}, ConfigError, "trace_steps must be >= 1, but got 0"),
    ({"trace_steps": 10**6}, ConfigError, r"trace_steps \(--trace\) must be between 1 and"),
    ({"plan": 42}, ConfigError, "plan must be a Plan, a Strategy"),
    ({"plan": "zero4"}, ConfigError, "strategy must be one of"),
    ({"cpus_per_worker": -1}, ConfigError, "cpus_per_worker must be >= 0"),
    ({"cpus_per_worker": "1"}, ConfigError, "cpus_per_worker must be a number"),
    ({"gpus_per_worker": math.nan}, ConfigError, "gpus_per_worker must be a finite number"),
    ({"run_dir": 5}, ConfigError, "run_dir must be a path"),
    ({"run_dir": "afile/run"}, ConfigError, "afile is a file"),
    ({"checkpoint_dir": "afile/ckpt"}, ConfigError, "afile is a file"),
    ({"checkpoint_every": 0}, ConfigError, "checkpoint_every must be >= 1"),
    ({"keep_checkpoints": 0}, ConfigError, "keep_checkpoints must be >= 1"),
    ({"resume": 5}, ConfigError, "resume must be a path"),
    ({"resume": "nope"}, CheckpointError, "no checkpoint at nope"),
    ({"max_failures": -1}, ConfigError, "max_failures must be >= 0"),
    ({"address": "head-node"}, ConfigError, "address must be HOST:PORT"),
    ({"progress": "yes"}, ConfigError, "progress must be True or False"),
    ({"placement_timeout_s": -5}, ConfigError, "placement_timeout_s must be > 0"),
    ({"collective_timeout_s": 0}, ConfigError, "collective_timeout_s must be > 0"),
    ({"callbacks": [print]}, ConfigError, "callbacks must be unipar.Callback instances"),
    ({"size_target": 4}, ConfigError, "size_target must be a callable returning a number"),
]


@pytest.mark.parametrize(
    ("arguments", "error", "pattern"), FIT_ARGUMENTS, ids=[str(a) for a, _, _ in FIT_ARGUMENTS]
)
def test_fit_argument(arguments, error, pattern, workdir, no_ray):
    arguments = {"job": tiny_gpt_job(), **arguments}
    with pytest.raises(error, match=pattern) as raised:
        fit(**arguments)
    assert "\n" not in str(raised.value)
    _nothing_written(workdir)


def _summed_loss(outputs, targets):
    return torch.nn.functional.cross_entropy(
        outputs.reshape(-1, outputs.size(-1)), targets.reshape(-1), reduction="sum"
    )


def test_fit_refuses_an_adaptive_job_with_a_summed_loss(workdir, no_ray):
    job = _job(adaptive=AdaptiveBatch(64), loss=_summed_loss)
    with pytest.raises(
        ConfigError,
        match=r"needs a loss that is a mean over samples .*\(reduction='mean'\)",
    ):
        fit(job=job)
    _nothing_written(workdir)


def test_every_fit_argument_has_a_bad_value_above():
    """fit's own arguments and every run setting it takes by name (RunConfig's flags)."""
    import inspect

    from unipar.runtime.config import cli_fields

    tried = {name for arguments, _, _ in FIT_ARGUMENTS for name in arguments}
    own = set(inspect.signature(fit).parameters) - {"config", "settings"}
    assert own | {f.name for f in cli_fields()} == tried


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workers=st.integers(max_value=0),
    cpus=st.floats(max_value=-1e-9, allow_nan=False) | st.just(math.nan),
)
def test_fit_resource_settings_out_of_range(workers, cpus, workdir, no_ray):
    for arguments in ({"workers": workers}, {"cpus_per_worker": cpus}):
        with pytest.raises(ConfigError):
            fit(tiny_gpt_job(), **arguments)
    _nothing_written(workdir)


PLANS = [
    (Plan(mesh=Mesh(dp=4), microbatch_size=2), "the plan's mesh needs 4 workers"),
    (
        Plan(mesh=Mesh(dp=2), microbatch_size=4, grad_sync=GradSync.PARAMETER_SERVER),
        "nothing worth a parameter server: the model's embedding tables hold",
    ),
    (Plan(mesh=Mesh(dp=2), microbatch_size=2), r"= 4\) must equal the job's global_batch_size=8"),
]


@pytest.mark.parametrize(("plan", "pattern"), PLANS)
def test_plan_that_does_not_fit_the_run(plan, pattern, workdir, no_ray):
    with pytest.raises(ConfigError, match=pattern):
        fit(tiny_gpt_job(), workers=2, plan=plan)
    _nothing_written(workdir)


def test_parameter_server_plan_that_is_not_pure_data_parallel_is_refused(
    workdir, no_ray, capsys
):
    plan = Plan(mesh=Mesh(tp=2), microbatch_size=8, grad_sync=GradSync.PARAMETER_SERVER)
    (workdir / "ps.json").write_text(plan.to_json())
    code, err = _cli(["train", "job.py", "--strategy", "ps.json"], capsys)
    _assert_one_clear_error(code, err)
    assert "a parameter-server plan is pure data parallel, but got tp=2" in err


def test_unipar_errors_are_value_errors_where_a_value_is_wrong():
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, UniparError)
    assert issubclass(UserCodeError, UniparError) and issubclass(ResourceError, UniparError)


# --- runs on Ray: what only the cluster can answer ----------------------------------


@pytest.fixture(scope="module")
def finished_run(ray_cluster, tmp_path_factory):
    """A completed run whose checkpoints the bad inputs below must not touch."""
    run_dir = tmp_path_factory.mktemp("finished")
    fit(tiny_gpt_job(steps=4), workers=2, run_dir=run_dir, checkpoint_every=2, progress=False)
    return run_dir


def test_more_workers_than_cluster(ray_cluster, tmp_path):
    with pytest.raises(ResourceError, match=r"needs 12 CPUs \(6 workers x 2 CPU each\).*has 4"):
        fit(
            tiny_gpt_job(global_batch_size=12),
            workers=6,
            cpus_per_worker=2,
            run_dir=tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run").exists()


def test_gpus_on_a_cluster_without_gpus_get_advice_that_fits(ray_cluster, tmp_path):
    with pytest.raises(ResourceError) as raised:
        fit(tiny_gpt_job(), workers=2, gpus_per_worker=1, run_dir=tmp_path / "run")
    message = str(raised.value)
    assert "the Ray cluster has 0" in message and "run without GPUs" in message
    assert "at most 0" not in message
    assert not (tmp_path / "run").exists()


def test_model_factory_raises(ray_cluster, tmp_path):
    with pytest.raises(UserCodeError, match=r"model factory raised RuntimeError: .*on purpose"):
        fit(tiny_gpt_job(failing_model=True), workers=2, run_dir=tmp_path, progress=False)


def _loss_failing_on_rank_1(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if torch.distributed.get_rank() == 1:
        raise ValueError("the loss failed on rank 1 on purpose")
    return cross_entropy_loss(logits, targets)


def test_a_loss_raising_on_one_rank_is_reported_not_its_peers_broken_collective(
    ray_cluster, tmp_path
):
    """Rank 1's loss raises; rank 0 then fails in its all-reduce (rank 1 cut its
    connections). The error is rank 1's, the cause, not rank 0's "connection closed"."""
    job = replace(tiny_gpt_job(steps=2), loss=_loss_failing_on_rank_1)
    with pytest.raises(UserCodeError, match=r"(?s)a worker raised.*failed on rank 1 on purpose"):
        fit(job, workers=2, run_dir=tmp_path, progress=False)


def test_dataset_smaller_than_one_global_batch(ray_cluster, tmp_path):
    job = tiny_gpt_job(global_batch_size=16, dataset_size=10)
    with pytest.raises(ConfigError, match="10 samples and global_batch_size=16"):
        fit(job, workers=2, run_dir=tmp_path, progress=False)


def test_unwritable_checkpoint_dir(tmp_path, no_ray):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=r"cannot be created: .*a-file is a file"):
        fit(tiny_gpt_job(), workers=2, checkpoint_dir=blocker / "ckpt", run_dir=tmp_path)
    assert blocker.read_text() == "not a directory"


def test_resume_from_missing_checkpoint(tmp_path, no_ray):
    with pytest.raises(CheckpointError, match="does not exist"):
        fit(tiny_gpt_job(), workers=2, run_dir=tmp_path, resume=tmp_path / "nope")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        fit(tiny_gpt_job(), workers=2, run_dir=tmp_path, resume=True)


def test_resume_from_corrupt_checkpoint(finished_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished_run / "checkpoints", copy)
    newest = sorted(copy.glob("step_*"))[-1]
    (newest / ".metadata").write_bytes(b"\x00garbage")
    before = _tree_digest(copy)
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        fit(tiny_gpt_job(steps=6), workers=2, checkpoint_dir=copy, run_dir=tmp_path, resume=True)
    assert _tree_digest(copy) == before


def test_existing_checkpoints_are_not_overwritten(finished_run):
    before = _tree_digest(finished_run)
    with pytest.raises(CheckpointError, match=r"already holds checkpoints.*resume=True"):
        fit(tiny_gpt_job(), workers=2, run_dir=finished_run, progress=False)
    assert _tree_digest(finished_run) == before


def test_batch_not_divisible_by_workers(no_ray):
    with pytest.raises(ConfigError, match="global_batch_size=9, workers=2"):
        fit(tiny_gpt_job(global_batch_size=9), workers=2)


def test_resume_continues_a_finished_run_to_more_steps(finished_run, ray_cluster, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    result = fit(tiny_gpt_job(steps=6), workers=2, run_dir=run, resume=True, progress=False)
    assert [m.step for m in result.history] == [4, 5]
    assert result.final_checkpoint.name == "step_00000006"
