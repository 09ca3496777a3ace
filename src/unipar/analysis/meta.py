"""Building a model on the meta device: shapes and dtypes, no memory, no values."""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from unipar.errors import ConfigError


class NotCompiled(TorchDispatchMode):
    """A dispatch mode for analysis on the meta device that never imports PyTorch's
    compiler (``torch._dynamo``: about 1 s of CPU of the 4 s of planning a large model
    from a cold process, measured with ``python -X importtime``). Two routes would
    import it:

    - the mode's own handler, which PyTorch wraps in the compiler's ``disable`` unless
      the mode opts out (``_should_skip_dynamo``, TorchDispatchMode's documented hook);
    - the Python meta kernels of elementwise ops (``aten.add`` on meta runs
      ``torch._refs``), wrapped in ``torch._disable_dynamo``, whose first call imports
      the compiler: :func:`_without_compiler_import` settles them first.

    (sympy and ``symbolic_shapes`` are still imported: the meta kernels' own
    ``torch._check`` and type promotion need them.)
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # PyTorch's opt-out (TorchDispatchMode's doc)
        return False

    def __enter__(self):  # type: ignore[no-untyped-def]
        _without_compiler_import()
        return super().__enter__()


_compiler_import_settled = False


def _without_compiler_import() -> None:
    """Settle, once per process, every function PyTorch wrapped in
    ``torch._disable_dynamo`` (found by their shared code object among live functions)
    so that calling it imports nothing: while ``torch._dynamo`` is not imported no
    frame can be under compilation and the wrapper has nothing to disable; once it is
    imported (a user's ``torch.compile``), each call goes through the compiler's
    ``disable`` as PyTorch intends. Uses the wrapper's own cache attribute
    (``__dynamo_disable`` in ``torch/_compile.py``); where a future PyTorch has no
    such wrapper, nothing is settled and only the import's time is lost."""
    global _compiler_import_settled
    if _compiler_import_settled:
        return
    _compiler_import_settled = True
    wrapper_code = getattr(torch._disable_dynamo(lambda: None), "__code__", None)
    if wrapper_code is None or "fn" not in wrapper_code.co_freevars:
        return
    slot = wrapper_code.co_freevars.index("fn")
    for candidate in gc.get_objects():
        if type(candidate) is types.FunctionType and candidate.__code__ is wrapper_code:
            wrapped = candidate.__closure__[slot].cell_contents
            if getattr(wrapped, "__dynamo_disable", None) is None:
                wrapped.__dynamo_disable = _disabled_when_compiling(wrapped)


def _disabled_when_compiling(fn: Callable) -> Callable:
    """``fn`` itself while the compiler is not imported, else ``torch._dynamo.disable(fn)``."""

    def call(*args, **kwargs):  # type: ignore[no-untyped-def]
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        import torch._dynamo  # noqa: PLC0415 (heavy: the compiler, only once a user imported it)

        return torch._dynamo.disable(fn, recursive=True, wrapping=False)(*args, **kwargs)

    return call


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


def branch_on_meta(func: object, args: tuple) -> bool:
    """Whether ``func(*args)`` reads a boolean from a meta tensor (a branch on data:
    Hugging Face's mask code checks ``(...).all()`` for packed sequences). Meta tensors
    hold no values; the caller takes the true branch, which is the plain batch's (one
    sequence per row)."""
    target = args[0] if args else None
    return (
        func is torch.ops.aten._local_scalar_dense.default
        and isinstance(target, torch.Tensor)
        and target.is_meta
        and target.dtype is torch.bool
    )


class BranchesOnMeta(NotCompiled):
    """Run a forward on the meta device through branches on data (see
    :func:`branch_on_meta`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if branch_on_meta(func, args):
            return True
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
