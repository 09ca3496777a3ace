"""Deterministic, resumable assignment of samples to optimizer steps and workers.

Global batch ``k`` is the same set of samples whatever the number of workers: the
epoch's permutation comes from ``(seed, epoch)`` alone, batch ``k`` takes the next
``global_batch_size`` entries of it, and worker ``r`` of ``W`` takes the ``r``-th
contiguous slice. A run resumed at step ``k`` therefore neither skips nor repeats
a sample, even with another worker count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unipar.errors import ConfigError


@dataclass(frozen=True)
class GlobalBatchSampler:
    dataset_size: int
    global_batch_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.dataset_size < self.global_batch_size:
            raise ConfigError(
                f"the dataset must hold at least one global batch, but it has "
                f"{self.dataset_size} samples and global_batch_size={self.global_batch_size}; "
                "use a larger dataset or a smaller global_batch_size"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.global_batch_size

    def permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.dataset_size, generator=generator)

    def global_indices(self, step: int) -> torch.Tensor:
        """Indices of every sample in optimizer step ``step`` (the last partial batch
        of each epoch is dropped)."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.global_batch_size
        return self.permutation(epoch)[start : start + self.global_batch_size]

    def shard_indices(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        """The ``rank``-th of ``world_size`` equal contiguous slices of step ``step``."""
        per_worker = self.global_batch_size // world_size
        return self.global_indices(step)[rank * per_worker : (rank + 1) * per_worker]


class ShardedBatches:
    """One worker's view: the micro-batches it computes for each optimizer step.

    ``shares``: uneven data-parallel shares, samples per step of each rank (rank ``r``
    takes the ``shares[r]`` samples after those of ranks below it); empty: equal slices.
    Caches the current epoch's permutation so a step costs one slice, not a sort.
    """

    def __init__(
        self,
        sampler: GlobalBatchSampler,
        rank: int,
        world_size: int,
        microbatch_size: int,
        shares: tuple[int, ...] = (),
    ) -> None:
        self.sampler = sampler
        self.rank = rank
        self.world_size = world_size
        self.microbatch_size = microbatch_size
        self.shares = shares
        self._epoch = -1
        self._permutation = torch.empty(0, dtype=torch.long)

    def microbatches(self, step: int) -> list[torch.Tensor]:
        epoch, position = divmod(step, self.sampler.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._permutation = epoch, self.sampler.permutation(epoch)
        if self.shares:
            per_worker, offset = self.shares[self.rank], sum(self.shares[: self.rank])
        else:
            per_worker = self.sampler.global_batch_size // self.world_size
            offset = self.rank * per_worker
        start = position * self.sampler.global_batch_size + offset
        mine = self._permutation[start : start + per_worker]
        return list(mine.split(self.microbatch_size))


class SampleStream:
    """Samples by position in the stream of epoch permutations (position ``p`` is entry
    ``p mod N`` of epoch ``p div N``'s permutation), for runs whose global batch changes:
    the data position is a count of samples, not of steps. With a constant batch that
    divides the dataset it is :class:`GlobalBatchSampler`'s order exactly."""

    def __init__(self, dataset_size: int, seed: int) -> None:
        self.sampler = GlobalBatchSampler(dataset_size, 1, seed)
        self.size = dataset_size
        self._cached: dict[int, torch.Tensor] = {}

    def _epoch(self, epoch: int) -> torch.Tensor:
        if epoch not in self._cached:
            if len(self._cached) >= 2:  # a batch spans at most two epochs here
                self._cached.clear()
            self._cached[epoch] = self.sampler.permutation(epoch)
        return self._cached[epoch]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """The ``count`` samples from position ``start`` on (across epoch ends)."""
        parts, position, left = [], start, count
        while left > 0:
            epoch, offset = divmod(position, self.size)
            take = min(left, self.size - offset)
            parts.append(self._epoch(epoch)[offset : offset + take])
            position, left = position + take, left - take
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)
