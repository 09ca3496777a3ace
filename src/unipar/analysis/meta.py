"""Building a model on the meta device: shapes and dtypes, no memory, no values."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from unipar.errors import ConfigError


class NotCompiled(TorchDispatchMode):
    """A dispatch mode that never runs under ``torch.compile``: PyTorch leaves its
    handler as it is, where it would otherwise wrap it in its compiler's ``disable``,
    whose first call imports the compiler (torch._dynamo and sympy: 1.2 s of CPU, the
    largest part of planning a model from a cold process)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # PyTorch's opt-out (TorchDispatchMode's doc)
        return False


class SkipInPlaceOnMeta(NotCompiled):
    """While a model is built on meta: in-place ops (weight initialisation) change no
    shape and have no values to set, so skip them. Saves the cost of PyTorch's reference
    kernels for meta tensors, including a 2 s import on the first ``normal_``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        target = args[0] if args else None
        name = func.overloadpacket.__name__
        if isinstance(target, torch.Tensor) and target.is_meta and name.endswith("_"):
            return target
        return func(*args, **(kwargs or {}))


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    """``factory()`` on the meta device; a factory that fails there raises
    :class:`ConfigError` naming why."""
    try:
        with torch.device("meta"), SkipInPlaceOnMeta():
            model = factory()
    except Exception as error:
        raise ConfigError(
            f"the model factory failed on the meta device ({type(error).__name__}: "
            f"{error}); build parameters from shapes only, with no data-dependent code"
        ) from error
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"the model factory must return a torch.nn.Module, but returned "
            f"{type(model).__name__}; return the model (e.g. `return MyModel()`)"
        )
    return model
