"""Search spaces: a dict (Tune domains or plain specs) or a YAML file, checked before any
trial starts (each backend's form: :mod:`unipar.tuning.backends`).

A plain spec names a Ray Tune sampling function and its arguments, in Python or YAML::

    lr: {loguniform: [1.0e-4, 1.0e-2]}
    warmup: {choice: [0, 5, 10]}
    weight_decay: {uniform: [0.0, 0.1]}
    width: {randint: [32, 129]}        # upper bound excluded, as in Tune
    layers: {qrandint: [2, 8, 2]}      # 2, 4, 6 or 8: upper bound included (q > 1)
    init: {randn: [0.0, 0.02]}         # mean, sd
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

import yaml

from unipar.errors import ConfigError


class ParamKind(Enum):
    """Ray Tune's sampling functions, by their names and arguments (``tune.<name>(*values)``)."""

    UNIFORM = "uniform"  # [low, high]
    QUNIFORM = "quniform"  # [low, high, q]: multiples of q
    LOGUNIFORM = "loguniform"  # [low, high], log scale
    QLOGUNIFORM = "qloguniform"  # [low, high, q]
    RANDN = "randn"  # [mean, sd]: normal
    QRANDN = "qrandn"  # [mean, sd, q]
    RANDINT = "randint"  # [low, high): upper bound excluded
    QRANDINT = "qrandint"  # [low, high, q]: upper bound included (excluded for q = 1)
    LOGRANDINT = "lograndint"  # [low, high), log scale
    QLOGRANDINT = "qlograndint"  # [low, high, q], log scale
    CHOICE = "choice"
    GRID = "grid"
    CONSTANT = "constant"


FLOATS = (ParamKind.UNIFORM, ParamKind.QUNIFORM, ParamKind.LOGUNIFORM, ParamKind.QLOGUNIFORM)
INTS = (ParamKind.RANDINT, ParamKind.QRANDINT, ParamKind.LOGRANDINT, ParamKind.QLOGRANDINT)
NORMALS = (ParamKind.RANDN, ParamKind.QRANDN)
LOGS = (ParamKind.LOGUNIFORM, ParamKind.QLOGUNIFORM, ParamKind.LOGRANDINT, ParamKind.QLOGRANDINT)
QUANTIZED = (
    ParamKind.QUNIFORM,
    ParamKind.QLOGUNIFORM,
    ParamKind.QRANDN,
    ParamKind.QRANDINT,
    ParamKind.QLOGRANDINT,
)
_RANGES = FLOATS + INTS


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its kind and values (the arguments of Ray Tune's function of
    that name for a range or a normal; the values for a choice, grid or constant)."""

    name: str
    kind: ParamKind
    values: tuple[Any, ...]

    @property
    def q(self) -> float | int | None:
        return self.values[2] if self.kind in QUANTIZED else None

    def grid(self) -> tuple[int, int]:
        """A quantized range's multiples of q as indices ``(first, last)``: the values are
        ``k * q`` for ``first <= k <= last`` (Ray Tune's ``Quantized`` sampler)."""
        low, high, q = self.values
        first, last = _index(low / q, math.ceil), _index(high / q, math.floor)
        if self.kind in INTS and q == 1:
            last -= 1  # Tune's integer samplers exclude the upper bound when q = 1
        return first, last

    def ends(self) -> tuple[Any, ...]:
        """The values at the ends of the range (a normal: its mean; else every value)."""
        if self.kind in NORMALS:
            return (self.values[0],)
        if self.kind in QUANTIZED:
            first, last = self.grid()
            cast = int if self.kind in INTS else float
            return (cast(first * self.q), cast(last * self.q))
        if self.kind in (ParamKind.RANDINT, ParamKind.LOGRANDINT):
            return (self.values[0], self.values[1] - 1)
        return tuple(self.values)

    def tune_domain(self) -> Any:
        """Ray Tune's domain of this parameter (a value for a constant)."""
        from ray import tune  # noqa: PLC0415 (heavy: Ray Tune)

        if self.kind is ParamKind.CHOICE:
            return tune.choice(list(self.values))
        if self.kind is ParamKind.GRID:
            return tune.grid_search(list(self.values))
        if self.kind is ParamKind.CONSTANT:
            return self.values[0]
        return getattr(tune, self.kind.value)(*self.values)


def _index(scaled: float, round_fn: Any) -> int:
    """``scaled`` rounded inwards, unless it is a whole number up to rounding error."""
    nearest = round(scaled)
    return int(nearest) if math.isclose(scaled, nearest) else int(round_fn(scaled))


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
    if not path.is_file():
        raise ConfigError(f"the search-space file {path} does not exist; pass a YAML file")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"the search-space file {path} is not valid YAML: {error}") from None
    return {} if loaded is None else loaded  # an empty file is an empty space


def _param(name: str, spec: Any) -> Param:
    from ray.tune.search.sample import Categorical, Domain  # noqa: PLC0415 (heavy: Ray Tune)

    if isinstance(spec, Domain) and not isinstance(spec, Categorical):
        return _from_tune(name, spec)
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


def _from_tune(name: str, domain: Any) -> Param:
    """A Ray Tune range or normal as the kind of the Tune function that makes it."""
    from ray.tune.search.sample import Float, Integer, LogUniform, Normal, Quantized, Uniform  # noqa: PLC0415 (heavy: Ray Tune)

    sampler = domain.get_sampler()
    q = sampler.q if isinstance(sampler, Quantized) else None
    inner = sampler.get_sampler() if isinstance(sampler, Quantized) else sampler
    kinds = {
        (Float, Uniform): ParamKind.UNIFORM,
        (Float, LogUniform): ParamKind.LOGUNIFORM,
        (Float, Normal): ParamKind.RANDN,
        (Integer, Uniform): ParamKind.RANDINT,
        (Integer, LogUniform): ParamKind.LOGRANDINT,
    }
    kind = next(
        (k for (d, s), k in kinds.items() if isinstance(domain, d) and isinstance(inner, s)),
        None,
    )
    if kind is None:
        raise ConfigError(
            f"parameter {name!r} is a {type(domain).__name__} domain sampled by "
            f"{type(inner).__name__}, which unipar cannot pass to every searcher; use one of "
            f"{', '.join(k.value for k in ParamKind if k is not ParamKind.CONSTANT)}"
        )
    values = (inner.mean, inner.sd) if kind is ParamKind.RANDN else (domain.lower, domain.upper)
    if q is not None:
        kind = ParamKind("q" + kind.value)
        values = (*values, q)
    return _checked(name, kind, values)


def _checked(name: str, kind: ParamKind, values: tuple[Any, ...]) -> Param:
    if kind in _RANGES or kind in NORMALS:
        _check_numbers(name, kind, values)
    elif kind is not ParamKind.CONSTANT and not values:
        raise ConfigError(f"parameter {name!r} ({kind.value}) needs at least one value")
    elif kind is ParamKind.CONSTANT and len(values) != 1:
        raise ConfigError(f"parameter {name!r} (constant) takes one value, got {list(values)}")
    return Param(name, kind, values)


def _check_numbers(name: str, kind: ParamKind, values: tuple[Any, ...]) -> None:
    first, second = ("mean", "sd") if kind in NORMALS else ("low", "high")
    shape = f"[{first}, {second}, q]" if kind in QUANTIZED else f"[{first}, {second}]"
    count = 3 if kind in QUANTIZED else 2
    if len(values) != count or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    ):
        raise ConfigError(
            f"parameter {name!r} ({kind.value}) needs {('two', 'three')[count - 2]} numbers "
            f"{shape}, but got "
            f"{list(values)}"
        )
    if kind in INTS and not all(isinstance(v, int) for v in values):
        raise ConfigError(
            f"parameter {name!r} ({kind.value}) needs integers, got {list(values)}; use "
            f"{kind.value.replace('randint', 'uniform')} for a float range"
        )
    if kind in QUANTIZED and not values[2] > 0:
        raise ConfigError(f"parameter {name!r} ({kind.value}) needs q > 0, but got q={values[2]}")
    if kind in NORMALS:
        if not values[1] > 0:
            raise ConfigError(
                f"parameter {name!r} ({kind.value}) needs sd > 0, but got sd={values[1]}"
            )
        return
    low, high = values[:2]
    if not low < high:
        raise ConfigError(
            f"parameter {name!r} ({kind.value}) needs low < high, but got low={low}, "
            f"high={high}"
        )
    if kind in LOGS and low <= 0:
        raise ConfigError(
            f"parameter {name!r} ({kind.value}) needs low > 0, but got low={low}; use "
            f"{kind.value.replace('log', '')} for a range that starts at 0"
        )
    if kind in FLOATS and kind in QUANTIZED:
        q = values[2]
        if not all(math.isclose(v / q, round(v / q)) for v in (low, high)):
            raise ConfigError(
                f"parameter {name!r} ({kind.value}) needs low and high that are multiples "
                f"of q (as Ray Tune does), but got low={low}, high={high}, q={q}; round "
                "them to multiples of q"
            )
    if kind in QUANTIZED:
        first_k, last_k = Param(name, kind, values).grid()
        if last_k < first_k:
            raise ConfigError(
                f"parameter {name!r} ({kind.value}) has no multiple of q={values[2]} "
                f"in [{low}, {high}]; widen the range or use a smaller q"
            )
