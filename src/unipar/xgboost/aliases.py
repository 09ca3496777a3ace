"""XGBoost-Ray's module names: ``unipar.xgboost.main`` is ``unipar.xgboost.driver``,
``unipar.xgboost.callback`` is ``unipar.xgboost.callbacks``, and ``unipar.xgboost_ray.X``
is ``unipar.xgboost.X`` (the same module object, so module state such as the actor's
session is shared). Resolved on import, by a finder on ``sys.meta_path``."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

RENAMED = {"main": "driver", "callback": "callbacks"}
PREFIXES = ("unipar.xgboost.", "unipar.xgboost_ray.")


def target(fullname: str) -> str | None:
    """The real module behind an alias name, or ``None`` when the name is no alias."""
    for prefix in PREFIXES:
        if fullname.startswith(prefix):
            rest = fullname[len(prefix) :]
            head, _, tail = rest.partition(".")
            renamed = RENAMED.get(head)
            if prefix == "unipar.xgboost_ray." or renamed:
                real = "unipar.xgboost." + (renamed or head) + ("." + tail if tail else "")
                return real if real != fullname else None
    return None


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


def install_aliases() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
