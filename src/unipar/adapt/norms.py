"""Squared gradient norms for the noise estimator, and the mean-loss check it relies on.

The estimator (:mod:`unipar.adapt.noise`) needs the squared norm of whole gradients: a
sharded gradient (FSDP, tensor parallel DTensor) or one split over pipeline stages gives
the sum of its local parts' squares, and the caller sums those over the shards or stages
(one all-reduce of a scalar). ``weights`` give a weighted norm Σ w·g²; the runtime uses
raw gradients (w = 1) under every optimizer: Pollux's Adam variant (AdaptDL's
``AdamGradientNoiseScale``: Σ (g/(√v̂ + ε))², v̂ Adam's bias-corrected second moment)
was measured on the demo GPT and put its noise scale at 200-10,000 against 15-80 raw,
growing the batch to 120 and doubling the time to the benchmark's target (README,
"Adaptive batch size").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from unipar.data.batch import concat
from unipar.errors import ConfigError


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def squared_norm(
    grads: Iterable[torch.Tensor | None],
    weights: Iterable[torch.Tensor | None] | None = None,
) -> float:
    """Σ w·g² over this process's part of the gradients (``weights`` None: w = 1)."""
    grads = list(grads)
    weights = list(weights) if weights is not None else [None] * len(grads)
    total = torch.zeros((), dtype=torch.float64)
    for g, w in zip(grads, weights, strict=True):
        if g is None:
            continue
        sq = _local(g).detach().double() ** 2
        total += (sq * w.double()).sum() if w is not None else sq.sum()
    return float(total)


def check_mean_loss(loss_fn, outputs: Any, targets: Any) -> None:
    """The noise estimate scales gradients by their batch: the loss must be a mean over
    samples. A mean is the same on the batch repeated twice; a sum doubles. ``outputs``
    and ``targets``: tensors or trees of them (a ``ModelOutput``, a dict of labels)."""
    with torch.no_grad():
        once = float(loss_fn(outputs, targets))
        twice = float(loss_fn(concat([outputs, outputs]), concat([targets, targets])))
    if not abs(twice - once) <= 1e-4 * max(abs(once), 1e-8):
        raise ConfigError(
            f"adaptive batch needs a loss that is a mean over samples (the same on a batch "
            f"repeated twice), but the job's loss gave {once:.6g} on a batch and {twice:.6g} on "
            "it twice; divide the loss by the batch size (reduction='mean')"
        )
