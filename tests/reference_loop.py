"""The plain single-process PyTorch training loop parity tests compare to (it lives in
:mod:`unipar.testing`, where the benchmarks use it too)."""

from __future__ import annotations

from unipar.testing import single_process_losses

__all__ = ["single_process_losses"]
