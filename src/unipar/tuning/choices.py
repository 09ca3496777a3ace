"""The searchers and schedulers by name, each built from Ray Tune (or Optuna) itself."""

from __future__ import annotations

from enum import Enum
from typing import Any

from unipar.errors import ConfigError
from unipar.tuning.backends import hyperopt_expression
from unipar.tuning.space import ParamKind, SearchSpace

# ASHA's and HyperBand's reduction factor unless one is given: Ray Tune's own default
# and the ASHA paper's (Li et al., MLSys 2020)
DEFAULT_REDUCTION_FACTOR = 4


class SearcherKind(Enum):
    RANDOM = "random"  # random and grid: Tune's BasicVariantGenerator
    GRID = "grid"
    OPTUNA = "optuna"  # Optuna's TPE, driven by unipar (pruners work)
    HYPEROPT = "hyperopt"


class SchedulerKind(Enum):
    FIFO = "fifo"
    ASHA = "asha"
    HYPERBAND = "hyperband"
    MEDIAN = "median"
    PBT = "pbt"
    PB2 = "pb2"


def parse_kind(enum: type[Enum], value: Any, what: str) -> Any:
    if isinstance(value, enum):
        return value
    try:
        return enum(str(value).lower())
    except ValueError:
        raise ConfigError(
            f"unknown {what} {value!r}; choose one of {', '.join(k.value for k in enum)}"
        ) from None


def build_searcher(
    kind: SearcherKind,
    space: SearchSpace,
    metric: str,
    mode: str,
    seed: int | None,
    max_concurrent: int | None = None,
) -> Any:
    """Tune's searcher for ``kind``, seeded with ``seed`` and running at most
    ``max_concurrent`` trials at once (None: no limit)."""
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter  # noqa: PLC0415 (heavy: Ray Tune)

    if kind in (SearcherKind.RANDOM, SearcherKind.GRID):  # Tune's variant generator
        return BasicVariantGenerator(max_concurrent=max_concurrent or 0, random_state=seed)
    if space.has_grid:
        raise ConfigError(
            f"the {kind.value} searcher samples, it cannot enumerate a grid; use `choice` "
            "instead of `grid`, or searcher='grid'"
        )
    if kind is SearcherKind.HYPEROPT:
        try:
            from ray.tune.search.hyperopt import HyperOptSearch  # noqa: PLC0415 (optional: hyperopt)

            space_ = {p.name: hyperopt_expression(p) for p in space.params}
            searcher = HyperOptSearch(
                space_, metric=metric, mode=mode, random_state_seed=seed
            )
        except (ImportError, AssertionError):
            raise ConfigError(
                "the hyperopt searcher needs hyperopt, which is not installed; "
                "`pip install unipar[tune]` (or `pip install hyperopt`)"
            ) from None
        if max_concurrent is None:
            return searcher
        return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    raise ConfigError("the optuna searcher is built by unipar.tuning.optuna_driver")


def build_scheduler(
    kind: SchedulerKind,
    space: SearchSpace,
    *,
    max_steps: int,
    grace_steps: int,
    reduction_factor: int,
    perturbation_steps: int,
    seed: int | None,
) -> Any:
    """Tune's scheduler for ``kind``; time is counted in training steps (``step``).

    ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020,
    Algorithm 2) stops a trial at a rung of ``grace_steps * reduction_factor**k`` steps
    unless it is in the top ``1 / reduction_factor`` of the trials that reached that rung;
    run synchronously, n trials of S steps then cost
    ``sum_k n / rf**k * (rung_k - rung_{k-1})`` steps, e.g. 1/4 of ``n * S`` with a grace
    of S/8 and a factor of 4 (rungs S/8, S/2). Asynchronous promotion, ASHA's point, lets
    early arrivals through more easily, so the measured share is above it."""
    from ray.tune import schedulers  # noqa: PLC0415 (heavy: Ray Tune)

    if kind is SchedulerKind.FIFO:
        return schedulers.FIFOScheduler()
    if kind is SchedulerKind.ASHA:
        return schedulers.ASHAScheduler(
            time_attr="step",
            max_t=max_steps,
            grace_period=grace_steps,
            reduction_factor=reduction_factor,
        )
    if kind is SchedulerKind.HYPERBAND:
        return schedulers.HyperBandScheduler(
            time_attr="step", max_t=max_steps, reduction_factor=reduction_factor
        )
    if kind is SchedulerKind.MEDIAN:
        return schedulers.MedianStoppingRule(
            time_attr="step", grace_period=grace_steps, min_samples_required=2
        )
    # PBT reads a dict as a nested space: a grid's values go to it as the list they are
    mutations = {
        p.name: list(p.values) if p.kind is ParamKind.GRID else p.tune_domain()
        for p in space.params
        if p.kind is not ParamKind.CONSTANT
    }
    if kind is SchedulerKind.PBT:
        return schedulers.PopulationBasedTraining(
            time_attr="step",
            perturbation_interval=perturbation_steps,
            hyperparam_mutations=mutations,
            quantile_fraction=0.5,
            resample_probability=0.25,
            synch=False,
        )
    bounds = {
        p.name: list(p.values) for p in space.params if p.kind.value in ("uniform", "loguniform")
    }
    try:  # Ray's PB2 fits scikit-learn's Gaussian process (it raises RuntimeError without)
        import sklearn  # noqa: F401, PLC0415 (optional: scikit-learn)
    except ImportError:
        raise ConfigError(
            "the pb2 scheduler needs scikit-learn, which is not installed; "
            "`pip install scikit-learn`, or use scheduler='pbt'"
        ) from None
    from ray.tune.schedulers.pb2 import PB2  # noqa: PLC0415 (optional: scikit-learn)

    return PB2(time_attr="step", perturbation_interval=perturbation_steps, hyperparam_bounds=bounds)
