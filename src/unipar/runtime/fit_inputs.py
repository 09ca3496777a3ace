"""``fit``'s own arguments, those that are not run settings (a
:class:`~unipar.runtime.config.RunConfig` checks its fields itself, and
:func:`~unipar.runtime.config.worker_range` reads ``workers``): the job, the plan, the
callbacks, the address and the size target."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from unipar.errors import ConfigError
from unipar.job import Job
from unipar.plan import Plan, Strategy
from unipar.ray_cluster.address import check_address
from unipar.runtime.callbacks import Callback


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
