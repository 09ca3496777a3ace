"""Primitive checks of user-facing values: whole numbers, numbers, booleans, enum
members, paths, callables, names. Each raises :class:`~unipar.errors.ConfigError` whose
message states the rule, the value given and what to pass instead.

A leaf: it imports nothing of unipar but :mod:`unipar.errors`, so every dataclass can
check its fields in ``__post_init__`` with these (the domain rules sit beside their
types: :class:`~unipar.job.Job`, :class:`~unipar.runtime.config.RunConfig`,
:class:`~unipar.plan.Plan`, ...).
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
