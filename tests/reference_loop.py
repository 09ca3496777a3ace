"""The plain single-process PyTorch training loop parity tests compare to (it lives in
:mod:`unipar.testing`, where the benchmarks use it too)."""

from __future__ import annotations

import torch

from unipar.job import Job
from unipar.testing import single_process_losses

__all__ = ["assert_trained_like", "single_process_losses"]


def assert_trained_like(job: Job, final: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                        atol: float, moved: float) -> None:
    """``final`` weights (read back from a run's checkpoint) within ``atol`` of the
    single-process run's ``expected``, and at least ``moved`` away from the initial
    ones somewhere (the optimizer steps really happened)."""
    assert set(final) <= set(expected)
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=atol, msg=name)
    torch.manual_seed(job.seed)
    initial = job.model().state_dict()
    assert max((final[k] - initial[k]).abs().max().item() for k in final) > moved
