"""Search spaces: a dict (Tune domains or plain specs) or a YAML file, checked before any
trial starts, and turned into Ray Tune domains or Optuna distributions.

A plain spec names its kind and arguments, in Python or YAML::

    lr: {loguniform: [1.0e-4, 1.0e-2]}
    warmup: {choice: [0, 5, 10]}
    weight_decay: {uniform: [0.0, 0.1]}
    width: {randint: [32, 129]}        # upper bound excluded, as in Tune
    seed: {grid: [0, 1]}               # every value, random/grid searcher only
    steps: 20                          # a constant
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from unipar.errors import ConfigError


class ParamKind(Enum):
    UNIFORM = "uniform"
    LOGUNIFORM = "loguniform"
    RANDINT = "randint"
    CHOICE = "choice"
    GRID = "grid"
    CONSTANT = "constant"


_RANGES = (ParamKind.UNIFORM, ParamKind.LOGUNIFORM, ParamKind.RANDINT)


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its kind and values (``(low, high)`` for a range)."""

    name: str
    kind: ParamKind
    values: tuple[Any, ...]

    def tune_domain(self) -> Any:
        from ray import tune

        if self.kind is ParamKind.UNIFORM:
            return tune.uniform(*self.values)
        if self.kind is ParamKind.LOGUNIFORM:
            return tune.loguniform(*self.values)
        if self.kind is ParamKind.RANDINT:
            return tune.randint(*self.values)
        if self.kind is ParamKind.CHOICE:
            return tune.choice(list(self.values))
        if self.kind is ParamKind.GRID:
            return tune.grid_search(list(self.values))
        return self.values[0]

    def optuna_distribution(self) -> Any:
        """Optuna's distribution for this parameter (None for a constant)."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind is ParamKind.UNIFORM:
            return FloatDistribution(*self.values)
        if self.kind is ParamKind.LOGUNIFORM:
            return FloatDistribution(*self.values, log=True)
        if self.kind is ParamKind.RANDINT:
            return IntDistribution(self.values[0], self.values[1] - 1)
        if self.kind is ParamKind.CHOICE:
            return CategoricalDistribution(self.values)
        if self.kind is ParamKind.GRID:
            raise ConfigError(
                f"parameter {self.name!r} is a grid, which the optuna searcher cannot "
                "enumerate; use `choice` for it, or the random/grid searcher"
            )
        return None


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]

    @property
    def has_grid(self) -> bool:
        return any(p.kind is ParamKind.GRID for p in self.params)

    @property
    def grid_size(self) -> int:
        return math.prod(len(p.values) for p in self.params if p.kind is ParamKind.GRID)

    def tune_space(self) -> dict[str, Any]:
        return {p.name: p.tune_domain() for p in self.params}

    def constants(self) -> dict[str, Any]:
        return {p.name: p.values[0] for p in self.params if p.kind is ParamKind.CONSTANT}


def load_space(space: Mapping[str, Any] | str | Path) -> SearchSpace:
    """Parse ``space`` (a dict, or the path of a YAML file holding one)."""
    if isinstance(space, str | Path):
        space = _read_yaml(Path(space))
    if not isinstance(space, Mapping):
        raise ConfigError(
            f"a search space must be a mapping of parameter names to specs, but got "
            f"{type(space).__name__}; e.g. {{'lr': {{'loguniform': [1e-4, 1e-2]}}}}"
        )
    params = tuple(_param(str(name), spec) for name, spec in space.items())
    if not any(p.kind is not ParamKind.CONSTANT for p in params):
        raise ConfigError(
            "the search space has nothing to search (it is empty or all constants); add at "
            "least one parameter, e.g. lr: {loguniform: [1.0e-4, 1.0e-2]}"
        )
    return SearchSpace(params)


def _read_yaml(path: Path) -> Any:
    import yaml

    if not path.is_file():
        raise ConfigError(f"the search-space file {path} does not exist; pass a YAML file")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"the search-space file {path} is not valid YAML: {error}") from None
    return {} if loaded is None else loaded  # an empty file is an empty space


def _param(name: str, spec: Any) -> Param:
    from ray.tune.search.sample import Categorical, Float, Integer, LogUniform

    if isinstance(spec, Float):
        log = isinstance(spec.get_sampler(), LogUniform)
        kind = ParamKind.LOGUNIFORM if log else ParamKind.UNIFORM
        return _checked(name, kind, (spec.lower, spec.upper))
    if isinstance(spec, Integer):
        return _checked(name, ParamKind.RANDINT, (spec.lower, spec.upper))
    if isinstance(spec, Categorical):
        return _checked(name, ParamKind.CHOICE, tuple(spec.categories))
    if isinstance(spec, Mapping) and set(spec) == {"grid_search"}:
        return _checked(name, ParamKind.GRID, tuple(spec["grid_search"]))
    if isinstance(spec, Mapping):
        if len(spec) != 1:
            raise ConfigError(
                f"parameter {name!r} must have exactly one kind, but got {sorted(spec)}; "
                f"kinds: {', '.join(k.value for k in ParamKind if k is not ParamKind.CONSTANT)}"
            )
        [(kind_name, values)] = spec.items()
        try:
            kind = ParamKind(kind_name)
        except ValueError:
            raise ConfigError(
                f"parameter {name!r} has unknown kind {kind_name!r}; kinds: "
                f"{', '.join(k.value for k in ParamKind)}"
            ) from None
        values = tuple(values) if isinstance(values, list | tuple) else (values,)
        return _checked(name, kind, values)
    if isinstance(spec, bool | int | float | str) or spec is None:
        return Param(name, ParamKind.CONSTANT, (spec,))
    raise ConfigError(
        f"parameter {name!r} has a spec of type {type(spec).__name__}, which is not a search "
        "domain; use a ray.tune domain (tune.loguniform(...)), a dict like "
        "{'loguniform': [1e-4, 1e-2]}, or a constant"
    )


def _checked(name: str, kind: ParamKind, values: tuple[Any, ...]) -> Param:
    if kind in _RANGES:
        if len(values) != 2 or not all(isinstance(v, int | float) for v in values):
            raise ConfigError(
                f"parameter {name!r} ({kind.value}) needs two numbers [low, high], but got "
                f"{list(values)}"
            )
        low, high = values
        if not low < high:
            raise ConfigError(
                f"parameter {name!r} ({kind.value}) needs low < high, but got low={low}, "
                f"high={high}"
            )
        if kind is ParamKind.LOGUNIFORM and low <= 0:
            raise ConfigError(
                f"parameter {name!r} (loguniform) needs low > 0, but got low={low}; use "
                "uniform for a range that starts at 0"
            )
        if kind is ParamKind.RANDINT and not all(isinstance(v, int) for v in values):
            raise ConfigError(f"parameter {name!r} (randint) needs integers, got {list(values)}")
    elif kind is not ParamKind.CONSTANT and not values:
        raise ConfigError(f"parameter {name!r} ({kind.value}) needs at least one value")
    elif kind is ParamKind.CONSTANT and len(values) != 1:
        raise ConfigError(f"parameter {name!r} (constant) takes one value, got {list(values)}")
    return Param(name, kind, values)
