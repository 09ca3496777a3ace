"""Every user-facing input, checked in one place before Ray starts or a model is built.

The command line and the Python API share these rules: ``Job``, ``OptimizerSpec``,
``LRSchedule``, ``RunConfig``, ``Plan`` and the model configs call them when built;
``fit`` and ``unipar train`` call :func:`check_fit_inputs`. Each message says what is
wrong, the value given, and what to do. Pure checks: no torch, no Ray.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from unipar.errors import ConfigError


def integer(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an int within [minimum, maximum]; bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            f"{name} must be a whole number, but got {value!r} ({type(value).__name__}); "
            f"pass an int such as {minimum if minimum is not None else 0}"
        )
    _within(name, int(value), minimum, maximum)
    return int(value)


def number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> float:
    """``value`` as a finite float, ``minimum <= value <= maximum`` and
    ``above < value < below`` where given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(
            f"{name} must be a number, but got {value!r} ({type(value).__name__}); pass a "
            "float or an int"
        )
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, but got {value!r}; pass a real value")
    _within(name, value, minimum, maximum)
    if above is not None and not value > above:
        raise ConfigError(f"{name} must be > {above:g}, but got {value!r}; pass a larger value")
    if below is not None and not value < below:
        raise ConfigError(f"{name} must be < {below:g}, but got {value!r}; pass a smaller value")
    return float(value)


def _within(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ConfigError(
            f"{name} must be >= {_show(minimum)}, but got {value!r}; pass {_show(minimum)} or more"
        )
    if maximum is not None and value > maximum:
        raise ConfigError(
            f"{name} must be <= {_show(maximum)}, but got {value!r}; pass {_show(maximum)} or less"
        )


def _show(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, but got {value!r}")
    return value


def member(name: str, value: Any, enum: type) -> Any:
    """``value`` as a member of ``enum``: the member itself or its value."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except (ValueError, TypeError):
        choices = ", ".join(repr(m.value) for m in enum)  # type: ignore[attr-defined]
        raise ConfigError(
            f"{name} must be one of {choices} ({enum.__name__}), but got {value!r}"
        ) from None


def path(name: str, value: Any, *, optional: bool = False) -> Path | None:
    """A file system path given as ``str`` or ``os.PathLike`` (``None`` if optional)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(
            f"{name} must be a path (str or pathlib.Path), but got {value!r}; pass a directory "
            "name such as 'runs/a'"
        )
    return Path(value)


def directory_to_create(name: str, value: Path) -> None:
    """``value`` is, or can become, a directory this process writes to (nothing created)."""
    existing = Path(os.path.abspath(value))
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"{name} {value} is a file, not a directory; choose another path")
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{name} {value} cannot be created: {existing} is a file; choose another path"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{name} {value} is not writable (no write permission on {existing}); choose a "
            "directory you can write to"
        )


def callable_(name: str, value: Any, what: str) -> None:
    if not callable(value):
        raise ConfigError(
            f"{name} must be callable ({what}), but got {type(value).__name__} {value!r:.60}"
        )


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def run_name(name: str, value: Any) -> str:
    """A name that becomes part of a directory name."""
    if not isinstance(value, str) or not _NAME.match(value) or len(value) > 100:
        raise ConfigError(
            f"{name} must be 1-100 letters, digits, '.', '_', '+' or '-' (it names the run "
            f"directory), starting with a letter or digit, but got {value!r}"
        )
    return value


def positive_ints(owner: str, values: Iterable[tuple[str, Any]]) -> None:
    """Sizes (of a model, a mesh, a cluster) that must be whole numbers >= 1."""
    for name, value in values:
        integer(f"{owner}.{name}" if owner else name, value, minimum=1)


# --- Jobs ----------------------------------------------------------------------------


def check_optimizer(spec: Any) -> None:
    from unipar.job import OptimizerKind

    member("OptimizerSpec.kind", spec.kind, OptimizerKind)
    number("OptimizerSpec.lr", spec.lr, above=0)
    number("OptimizerSpec.weight_decay", spec.weight_decay, minimum=0)
    number("OptimizerSpec.momentum", spec.momentum, minimum=0)
    betas = spec.betas
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ConfigError(
            f"OptimizerSpec.betas must be a pair (beta1, beta2), but got {betas!r}; "
            "pass e.g. (0.9, 0.95)"
        )
    for index, beta in enumerate(betas):
        number(f"OptimizerSpec.betas[{index}]", beta, minimum=0, below=1)


def check_schedule(schedule: Any) -> None:
    from unipar.job import ScheduleKind

    member("LRSchedule.kind", schedule.kind, ScheduleKind)
    integer("LRSchedule.warmup_steps", schedule.warmup_steps, minimum=0)
    number("LRSchedule.min_ratio", schedule.min_ratio, minimum=0, maximum=1)


def check_job(job: Any) -> None:
    from unipar.job import LRSchedule, OptimizerSpec

    callable_("Job.model", job.model, "a factory returning an nn.Module")
    callable_("Job.dataset", job.dataset, "a factory returning a Dataset")
    callable_("Job.loss", job.loss, "loss(outputs, targets) -> scalar tensor")
    integer("Job.global_batch_size", job.global_batch_size, minimum=1)
    integer("Job.steps", job.steps, minimum=1)
    if not isinstance(job.optimizer, OptimizerSpec):
        callable_("Job.optimizer", job.optimizer, "an OptimizerSpec or a factory(params)")
    if not isinstance(job.lr_schedule, LRSchedule):
        raise ConfigError(
            f"Job.lr_schedule must be an LRSchedule, but got {job.lr_schedule!r}; pass "
            "LRSchedule(ScheduleKind.WARMUP_COSINE, warmup_steps=...) or leave it out"
        )
    integer("Job.seed", job.seed, minimum=0, maximum=2**32 - 1)
    run_name("Job.name", job.name)
    if job.grad_clip_norm is not None:
        number("Job.grad_clip_norm", job.grad_clip_norm, above=0)
    if job.adaptive is not None:
        check_adaptive_for_job(job.adaptive, job)
    from unipar.job import ModelCall

    member("Job.call", job.call, ModelCall)
    if job.collate is not None:
        callable_("Job.collate", job.collate, "collate(samples) -> (inputs, targets)")
    if job.step is not None:
        callable_("Job.step", job.step, "step(model, (inputs, targets), ctx) -> loss")
        if job.adaptive is not None:
            raise ConfigError(
                "an adaptive batch checks that the job's loss is a mean over samples, which "
                "it cannot do for a custom Job.step; leave out one of step and adaptive"
            )


def check_adaptive(adaptive: Any) -> None:
    """The rules of :class:`~unipar.adapt.AdaptiveBatch` on its own."""
    from unipar.adapt.config import LRRule

    integer("AdaptiveBatch.max_global_batch", adaptive.max_global_batch, minimum=1)
    if adaptive.lr_rule is not None:
        member("AdaptiveBatch.lr_rule", adaptive.lr_rule, LRRule)
    integer("AdaptiveBatch.adapt_every", adaptive.adapt_every, minimum=1)
    number("AdaptiveBatch.smoothing", adaptive.smoothing, minimum=0, below=1)
    if adaptive.max_local_batch is not None:
        integer("AdaptiveBatch.max_local_batch", adaptive.max_local_batch, minimum=1)
    if adaptive.min_global_batch is not None:
        integer("AdaptiveBatch.min_global_batch", adaptive.min_global_batch, minimum=1)


def check_adaptive_for_job(adaptive: Any, job: Any) -> None:
    """An adaptive batch that fits the job: a bound above M0, a rule for its optimizer."""
    from unipar.adapt.config import AdaptiveBatch
    from unipar.adapt.lr import allowed_rules
    from unipar.job import OptimizerSpec

    if not isinstance(adaptive, AdaptiveBatch):
        raise ConfigError(
            f"Job.adaptive must be an AdaptiveBatch or None, but got {adaptive!r}; pass "
            "AdaptiveBatch(max_global_batch=...)"
        )
    if adaptive.max_global_batch < job.global_batch_size:
        raise ConfigError(
            f"AdaptiveBatch.max_global_batch must be at least the job's global_batch_size "
            f"(the initial batch M0), but got max_global_batch={adaptive.max_global_batch} < "
            f"global_batch_size={job.global_batch_size}; pass max_global_batch >= "
            f"{job.global_batch_size} (--max-batch)"
        )
    least = adaptive.min_global_batch
    if least is not None and least > job.global_batch_size:
        raise ConfigError(
            f"AdaptiveBatch.min_global_batch must be at most the job's global_batch_size (the "
            f"initial batch M0, where the run starts), but got min_global_batch={least} > "
            f"global_batch_size={job.global_batch_size}; pass min_global_batch <= "
            f"{job.global_batch_size} or leave it out (M0)"
        )
    if not isinstance(job.optimizer, OptimizerSpec):
        raise ConfigError(
            "adaptive batch scales the learning rate by a rule known for SGD, Adam and AdamW, "
            "but Job.optimizer is a factory with no rule; pass an OptimizerSpec (kind='sgd', "
            "'adam' or 'adamw') or leave adaptive out"
        )
    allowed = allowed_rules(job.optimizer.kind)
    if adaptive.lr_rule is not None and adaptive.lr_rule not in allowed:
        names = ", ".join(r.value for r in allowed)
        raise ConfigError(
            f"lr_rule={adaptive.lr_rule.value!r} has no meaning for optimizer "
            f"{job.optimizer.kind.value!r}; pass one of {names} or leave lr_rule out"
        )


# --- Runs ----------------------------------------------------------------------------


def check_run_config(config: Any) -> None:
    """The rules of every :class:`~unipar.runtime.config.RunConfig` field."""
    most = integer("workers", config.workers, minimum=1)
    if config.min_workers is not None:
        least = integer("min_workers", config.min_workers, minimum=1)
        if least > most:
            raise ConfigError(
                f"the fewest workers must not exceed the most, but got min={least} and "
                f"max={most}; pass workers=({min(least, most)}, {max(least, most)}) "
                f"(--workers {min(least, most)}:{max(least, most)})"
            )
    elastic = boolean("elastic", config.elastic)
    if not elastic and config.least_workers != most:
        raise ConfigError(
            f"a worker range ({config.least_workers}..{most}) needs elastic training, but got "
            f"elastic=False; pass a fixed number of workers, or leave elastic on"
        )
    if config.snapshot_every is not None:
        integer("snapshot_every", config.snapshot_every, minimum=0)
    if config.trace_steps is not None:
        integer("trace_steps", config.trace_steps, minimum=1)
    cpus = number("cpus_per_worker", config.cpus_per_worker, minimum=0)
    gpus = number("gpus_per_worker", config.gpus_per_worker, minimum=0)
    if cpus == 0 and gpus == 0:
        raise ConfigError(
            "a worker needs a CPU or a GPU, but got cpus_per_worker=0, gpus_per_worker=0; "
            "pass cpus_per_worker=1 (--cpus-per-worker 1)"
        )
    if gpus > 1 and not gpus.is_integer():
        raise ConfigError(
            f"gpus_per_worker above 1 must be a whole number (Ray's rule), but got {gpus:g}; "
            f"pass {math.floor(gpus)} or {math.ceil(gpus)}"
        )
    if config.run_dir is not None:  # None: a fresh directory under unipar_runs/
        path("run_dir", config.run_dir)
        directory_to_create("run_dir", Path(config.run_dir))
    if path("checkpoint_dir", config.checkpoint_dir, optional=True) is not None:
        directory_to_create("checkpoint_dir", Path(config.checkpoint_dir))
    if config.checkpoint_every is not None:
        integer("checkpoint_every", config.checkpoint_every, minimum=1)
    integer("keep_checkpoints", config.keep_checkpoints, minimum=1)
    if not isinstance(config.resume, bool):
        path("resume", config.resume)
    integer("max_failures", config.max_failures, minimum=0)
    boolean("progress", config.progress)
    for name in ("placement_timeout_s", "collective_timeout_s", "poll_interval_s"):
        number(name, getattr(config, name), above=0)


def worker_range(workers: Any) -> tuple[int | None, int]:
    """``fit``'s ``workers``: a number (``(None, n)``: a fixed size) or a range
    ``(least, most)``; the numbers are checked with the run's other settings."""
    if isinstance(workers, tuple):
        if len(workers) != 2:
            raise ConfigError(
                f"workers must be a number or a range (least, most), but got {workers!r}; "
                "pass e.g. workers=(2, 8)"
            )
        return workers[0], workers[1]
    return None, workers


def check_address(address: Any) -> str | None:
    """``None`` (start a local cluster), ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``."""
    if address is None:
        return None
    if isinstance(address, str) and address in ("auto", "local"):
        return address
    host, _, port = str(address).removeprefix("ray://").rpartition(":")
    if not isinstance(address, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"address must be HOST:PORT of a Ray cluster's head (e.g. 10.0.0.5:6379), "
            f"'ray://HOST:PORT' or 'auto', but got {address!r}; leave it out to start a "
            "local cluster"
        )
    return address


def check_size_target(size_target: Any) -> None:
    """An outside bound on an elastic run's size: a callable giving workers or None."""
    if size_target is not None and not callable(size_target):
        raise ConfigError(
            f"size_target must be a callable returning a number of workers (or None for no "
            f"bound), but got {size_target!r}; pass a unipar.runtime.elastic.size_target.SizeTarget"
            " (it is callable), or leave it out"
        )


def check_fit_inputs(job: Any, plan: Any, callbacks: Any, address: Any) -> None:
    """``fit``'s arguments that are not run settings."""
    from unipar.job import Job
    from unipar.plan import Plan, Strategy
    from unipar.runtime.controller import Callback

    if not isinstance(job, Job):
        raise ConfigError(
            f"job must be a unipar.Job, but got {type(job).__name__}; build one with "
            "Job(model=..., dataset=..., global_batch_size=..., steps=...)"
        )
    if not (plan is None or isinstance(plan, (Plan, Strategy, str))):
        raise ConfigError(
            f"plan must be a Plan, a Strategy, a strategy name or None, but got "
            f"{type(plan).__name__}; pass e.g. plan='auto'"
        )
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise ConfigError(f"callbacks must be a sequence of Callback, but got {callbacks!r}")
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise ConfigError(
                f"callbacks must be unipar.Callback instances, but got "
                f"{type(callback).__name__}; subclass unipar.Callback"
            )
    check_address(address)


def check_plan_for_run(
    plan: Any, workers: int | tuple[int, int], global_batch_size: int | None = None
) -> None:
    """A plan the runtime can run on ``workers`` workers (one per mesh position; a range
    ``(least, most)`` for an elastic run: the plan is for a size within it), for a job of
    ``global_batch_size`` samples per step (when known)."""
    from unipar.plan import GradSync

    mesh = plan.mesh
    least, most = workers if isinstance(workers, tuple) else (workers, workers)
    if not least <= mesh.world_size <= most:
        size = f"{most}" if least == most else f"{least}..{most}"
        raise ConfigError(
            f"the plan's mesh needs {mesh.world_size} workers (pp={mesh.pp} x dp={mesh.dp} x "
            f"fsdp={mesh.fsdp} x cp={mesh.cp} x tp={mesh.tp}), but workers={size}; pass "
            f"workers={mesh.world_size} (--workers {mesh.world_size}) or a plan for {most} "
            "workers"
        )
    if plan.grad_sync is GradSync.PARAMETER_SERVER:
        from unipar.runtime.servers.for_job import check_servers_plan

        check_servers_plan(plan)
    from unipar.plan.runtime_support import unsupported_features

    lacking = unsupported_features(plan)
    if lacking:
        raise ConfigError("; ".join(lacking))
    if global_batch_size is not None and plan.global_batch_size != global_batch_size:
        raise ConfigError(
            f"the plan's global batch (microbatch_size={plan.microbatch_size} x "
            f"num_microbatches={plan.num_microbatches} x data replicas="
            f"{mesh.data_replicas} = {plan.global_batch_size}) must equal the job's "
            f"global_batch_size={global_batch_size}; adjust one of them"
        )
