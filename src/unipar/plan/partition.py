"""Pipeline stages: split the layers into contiguous runs that minimise the slowest.

Dynamic programming over (runs, prefix end), the inter-operator pass of Alpa (Zheng et
al. 2022, Sec. 5): ``best[k][j] = min over i of max(best[k-1][i], sum(weights[i:j]))``,
one vectorised row per run. Row ``k`` depends only on the rows before it, so a split
into fewer parts of the same weights is a prefix of the work for more: a search that
splits the same weights many ways (every pipeline depth and interleaving) extends one
table instead of starting again, with the very same answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from unipar.analysis.profile import LayerKind, ModelProfile
from unipar.errors import ConfigError

_MAX_SHARED_UNITS = 256  # tables of larger splits are not kept (each is units^2 floats)
_MAX_SHARED_TABLES = 32


class _Table:
    """The dynamic program for one list of weights, extended a row at a time."""

    def __init__(self, weights: Sequence[float]) -> None:
        n = self.n = len(weights)
        prefix = np.concatenate([[0.0], np.cumsum(weights)])
        span = prefix[None, :] - prefix[:, None]  # span[i, j] = sum(weights[i:j])
        best = np.where(np.arange(n + 1) > 0, span[0], np.inf)
        best[0] = np.inf
        span[np.tril_indices(n + 1)] = np.inf  # need i < j
        self.span, self.best = span, best
        self.columns = np.arange(n + 1)
        self.cost = np.empty_like(span)
        self.choices: list[np.ndarray] = []

    def split(self, parts: int) -> list[list[int]]:
        n = self.n
        if not 1 <= parts <= n:
            raise ConfigError(f"cannot split {n} layers into {parts} pipeline stages")
        while len(self.choices) < parts - 1:
            np.maximum(self.best[:, None], self.span, out=self.cost)
            choice = self.cost.argmin(axis=0)
            self.choices.append(choice)
            self.best = self.cost[choice, self.columns]
        cuts, end = [], n
        for choice in reversed(self.choices[: parts - 1]):
            start = int(choice[end])
            cuts.append(start)
            end = start
        bounds = [0, *reversed(cuts), n]
        return [list(range(bounds[k], bounds[k + 1])) for k in range(parts)]


def balanced_partition(weights: Sequence[float], parts: int) -> list[list[int]]:
    """Split ``weights`` into ``parts`` contiguous non-empty runs minimising the largest
    run's sum (module doc)."""
    return _Table(weights).split(parts)


def pipeline_cut_points(profile: ModelProfile) -> list[int]:
    """Layers a pipeline stage may start at. A model of repeated blocks is cut before
    every block but the first; the layers around the blocks (embeddings, final norm,
    output) stay with their neighbouring block, as in Megatron-LM and torchtitan, so a
    stage is a run of whole blocks. A model with fewer than two blocks (an
    ``nn.Sequential`` of convolutions, activations and linear layers) is cut before any
    layer holding parameters but the first: GPipe's cut of a sequence of layers (Huang
    et al. 2019, Sec. 2)."""
    blocks = [i for i, layer in enumerate(profile.layers) if layer.kind is LayerKind.BLOCK]
    if len(blocks) >= 2:
        return blocks[1:]
    holding = [i for i, layer in enumerate(profile.layers) if layer.params > 0]
    return holding[1:]


def max_pipeline_stages(profile: ModelProfile) -> int:
    """How many pipeline stages the model's cut points allow."""
    return len(pipeline_cut_points(profile)) + 1


class StagePartitions:
    """:func:`stage_partition` for one model, many times: the runs of whole blocks are
    found once, and the tables of weights already split are kept and extended."""

    def __init__(self, profile: ModelProfile) -> None:
        self.layers = len(profile.layers)
        bounds = [0, *pipeline_cut_points(profile), self.layers]
        self.units = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
        self._tables: dict[tuple[float, ...], _Table] = {}
        # the same list of weights (a cost model's, kept) is summed per unit once
        self._summed: dict[int, tuple[Sequence[float], tuple[float, ...]]] = {}

    def split(self, weights: Sequence[float], parts: int) -> list[list[int]]:
        """The layers of each of ``parts`` stages, cut only at :func:`pipeline_cut_points`,
        minimising the heaviest stage's summed ``weights`` (one per layer)."""
        if parts == 1:
            return [list(range(len(weights)))]
        summed = self._summed.get(id(weights))
        if summed is None or summed[0] is not weights:
            units = tuple(sum(weights[i] for i in unit) for unit in self.units)
            summed = self._summed[id(weights)] = (weights, units)
        unit_weights = summed[1]
        table = self._tables.get(unit_weights)
        if table is None:
            table = _Table(unit_weights)
            if len(unit_weights) <= _MAX_SHARED_UNITS:
                if len(self._tables) >= _MAX_SHARED_TABLES:
                    del self._tables[next(iter(self._tables))]  # the oldest
                self._tables[unit_weights] = table
        grouped = table.split(parts)
        return [[i for u in group for i in self.units[u]] for group in grouped]


def stage_partition(profile: ModelProfile, weights: Sequence[float], parts: int) -> list[list[int]]:
    """The layers of each of ``parts`` stages, cut only at :func:`pipeline_cut_points`,
    minimising the heaviest stage's summed ``weights``."""
    return StagePartitions(profile).split(weights, parts)
