"""Each parameter in the form a backend samples: an Optuna distribution, a HyperOpt
expression (and a Ray Tune domain, :meth:`~unipar.tuning.space.Param.tune_domain`). Each
samples the values and the scale of Ray Tune's
sampler of the same name (``ray.tune.search.sample``): the same bounds (an integer
range's upper bound excluded, a quantized one's included unless q = 1), the multiples of
q, and a log scale where Tune's is.

Optuna has no log scale with a step: a quantized log range is sampled there as the index
``k`` of its multiples ``k * q`` (log-uniform over ``k`` is log-uniform over ``k * q``),
and :func:`from_optuna` maps it back. Optuna has no normal distribution.
"""

from __future__ import annotations

import math
from typing import Any

from unipar.errors import ConfigError
from unipar.tuning.space import INTS, NORMALS, Param, ParamKind

_INDEXED = (ParamKind.QLOGUNIFORM, ParamKind.QLOGRANDINT)  # Optuna samples their index


def optuna_distribution(p: Param) -> Any:
    """Optuna's distribution for ``p`` (None for a constant)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: PLC0415 (optional: optuna)
    from optuna.distributions import IntDistribution as Int  # noqa: PLC0415 (optional: optuna)

    kind = p.kind
    if kind is ParamKind.CONSTANT:
        return None
    if kind is ParamKind.CHOICE:
        return CategoricalDistribution(p.values)
    if kind is ParamKind.GRID or kind in NORMALS:
        what = "a grid" if kind is ParamKind.GRID else f"a normal ({kind.value})"
        fix = "`choice`" if kind is ParamKind.GRID else "a uniform range"
        raise ConfigError(
            f"parameter {p.name!r} is {what}, which the optuna searcher cannot sample; use "
            f"{fix} for it, or another searcher"
        )
    low, high = p.values[:2]
    if kind is ParamKind.UNIFORM:
        return FloatDistribution(low, high)
    if kind is ParamKind.LOGUNIFORM:
        return FloatDistribution(low, high, log=True)
    if kind is ParamKind.RANDINT:
        return Int(low, high - 1)
    if kind is ParamKind.LOGRANDINT:
        return Int(low, high - 1, log=True)
    first, last = p.grid()
    if kind is ParamKind.QUNIFORM:
        return FloatDistribution(first * p.q, last * p.q, step=p.q)
    if kind is ParamKind.QRANDINT:
        return Int(first * p.q, last * p.q, step=p.q)
    return Int(first, last, log=True)  # _INDEXED: the index k of k * q


def from_optuna(p: Param, value: Any) -> Any:
    """The parameter's value for an Optuna sample of :func:`optuna_distribution`."""
    if p.kind in _INDEXED:
        return value * p.q if p.kind in INTS else float(value * p.q)
    return value


def hyperopt_expression(p: Param) -> Any:
    """HyperOpt's expression for ``p`` (the value itself for a constant)."""
    from hyperopt import hp  # noqa: PLC0415 (optional: hyperopt)
    from hyperopt.pyll import scope  # noqa: PLC0415 (optional: hyperopt)

    kind, name = p.kind, p.name
    if kind is ParamKind.CONSTANT:
        return p.values[0]
    if kind is ParamKind.CHOICE:
        return hp.choice(name, list(p.values))
    if kind is ParamKind.GRID:
        raise ConfigError(
            f"parameter {name!r} is a grid, which the hyperopt searcher cannot enumerate; "
            "use `choice` for it, or the random/grid searcher"
        )
    if kind is ParamKind.RANDN:
        return hp.normal(name, *p.values)
    if kind is ParamKind.QRANDN:
        return hp.qnormal(name, *p.values)
    low, high = p.values[:2]
    if kind is ParamKind.UNIFORM:
        return hp.uniform(name, low, high)
    if kind is ParamKind.LOGUNIFORM:
        return hp.loguniform(name, math.log(low), math.log(high))
    if kind is ParamKind.RANDINT:  # each of low .. high - 1 equally likely
        return scope.int(hp.quniform(name, low - 0.5, high - 0.5, 1))
    if kind is ParamKind.LOGRANDINT:  # Tune floors a log-uniform sample
        return scope.int(hp.loguniform(name, math.log(low), math.log(high)))
    first, last = p.grid()
    q = p.q
    if kind is ParamKind.QUNIFORM:  # Tune rounds a uniform sample to a multiple of q
        return hp.quniform(name, first * q, last * q, q)
    if kind is ParamKind.QLOGUNIFORM:
        return hp.qloguniform(name, math.log(first * q), math.log(last * q), q)
    if kind is ParamKind.QRANDINT:  # each multiple equally likely
        return scope.int(hp.quniform(name, (first - 0.5) * q, (last + 0.5) * q, q))
    # QLOGRANDINT: Tune floors a log-uniform index in [first, last + 1), then times q
    return scope.int(hp.loguniform(name, math.log(first), math.log(last + 1))) * q
