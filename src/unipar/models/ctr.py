"""A click-through-rate model: one large embedding table looked up by several sparse
fields, then a small MLP; and synthetic clicks with Zipf-distributed ids (a few ids are
hot, most are rare, as in real CTR logs)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from torch import nn

from unipar.models.spec import ModelSpec


class CTRModel(nn.Module):
    def __init__(
        self, rows: int, dim: int = 8, fields: int = 4, hidden: int = 32, seed: int | None = None
    ) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.embedding = nn.Embedding(rows, dim)
        self.mlp = nn.Sequential(nn.Linear(fields * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embedding(ids).flatten(1)).squeeze(-1)


def ctr_spec(rows: int, dim: int = 8, fields: int = 4, hidden: int = 32) -> ModelSpec:
    """The planner's view of :class:`CTRModel`: one sample is ``fields`` ids."""
    return ModelSpec(
        name=f"ctr-{rows}x{dim}",
        factory=functools.partial(CTRModel, rows, dim, fields, hidden),
        sample_shape=(fields,),
    )


@dataclass(frozen=True)
class ZipfClicks:
    """Batches ``(ids, clicks)`` for ``(worker, clock)``, reproducible from ``seed``.

    Ids follow a Zipf law with exponent ``alpha`` over ``rows`` (rank ``r`` drawn with
    probability proportional to ``r^-alpha``), hashed so hot ids spread over the table;
    a click is likely when a hidden per-row score summed over the fields is positive.
    """

    rows: int
    batch: int = 64
    fields: int = 4
    alpha: float = 1.1
    seed: int = 0
    workers: int = 1
    distinct: int = 1 << 20  # Zipf support; ids beyond it never occur
    delay_s: float = 0.0  # time to read a batch (tests slow a run down with it)

    def ids(self, generator: torch.Generator, n: int) -> torch.Tensor:
        support = min(self.distinct, self.rows)
        u = torch.rand(n, generator=generator)
        # inverse CDF of a continuous Zipf (Pareto) law on [1, support]
        a = 1 - self.alpha
        rank = ((support**a - 1) * u + 1) ** (1 / a)
        rank = rank.long().clamp(1, support) - 1
        return (rank * 2654435761) % self.rows  # Knuth's multiplicative hash

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sin(ids.double() * 0.618).float()

    def __call__(self, worker: int, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + clock * 1009 + worker)
        ids = self.ids(g, self.batch * self.fields).reshape(self.batch, self.fields)
        logits = self.score(ids).sum(1) * 2
        clicks = (torch.rand(self.batch, generator=g) < torch.sigmoid(logits)).float()
        return ids, clicks


def ctr_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, clicks = batch
    return nn.functional.binary_cross_entropy_with_logits(model(ids), clicks)
