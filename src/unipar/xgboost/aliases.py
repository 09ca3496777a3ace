"""XGBoost-Ray's module names: ``unipar.xgboost.main`` is ``unipar.xgboost.driver``,
``unipar.xgboost.callback`` is ``unipar.xgboost.callbacks``, and ``unipar.xgboost_ray.X``
is ``unipar.xgboost.X`` (the same module object, so module state such as the actor's
session is shared). Resolved on import, by a finder on ``sys.meta_path``.

``install_aliases("xgboost_ray")`` adds a package of another name whose submodules are
unipar's the same way (``xgboost_ray.matrix`` is ``unipar.xgboost.matrix``); a submodule
unipar does not have is left to the package itself (its own files)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

REAL = "unipar.xgboost"
RENAMED = {"main": "driver", "callback": "callbacks"}
_prefixes = ["unipar.xgboost.", "unipar.xgboost_ray."]


def target(fullname: str) -> str | None:
    """The real module behind an alias name, or ``None`` when the name is no alias."""
    for prefix in _prefixes:
        if fullname.startswith(prefix):
            rest = fullname[len(prefix) :]
            head, _, tail = rest.partition(".")
            renamed = RENAMED.get(head)
            if prefix == REAL + "." and not renamed:
                return None
            real = f"{REAL}.{renamed or head}" + ("." + tail if tail else "")
            if prefix not in (REAL + ".", "unipar.xgboost_ray.") and not _exists(real):
                return None
            return real if real != fullname else None
    return None


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, real: str) -> None:
        self.real = real

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(self.real)

    def exec_module(self, module: ModuleType) -> None:
        """The real module ran already."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target_module: Any = None) -> Any:
        real = target(fullname)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def install_aliases(package: str | None = None) -> None:
    """Install the finder; with ``package``, also alias ``package.X`` to
    ``unipar.xgboost.X`` for every submodule unipar has."""
    if package is not None and package + "." not in _prefixes:
        _prefixes.append(package + ".")
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
