from __future__ import annotations

import pytest
import torch

from unipar import ConfigError
from unipar.data.sampler import GlobalBatchSampler, ShardedBatches


def test_shards_partition_each_global_batch():
    sampler = GlobalBatchSampler(dataset_size=100, global_batch_size=12, seed=3)
    for step in range(20):
        whole = sampler.global_indices(step)
        parts = torch.cat([sampler.shard_indices(step, r, 3) for r in range(3)])
        assert torch.equal(whole, parts)


def test_an_epoch_visits_every_sample_once_and_epochs_differ():
    sampler = GlobalBatchSampler(dataset_size=96, global_batch_size=8, seed=0)
    epoch0 = torch.cat([sampler.global_indices(s) for s in range(12)])
    epoch1 = torch.cat([sampler.global_indices(s) for s in range(12, 24)])
    assert sorted(epoch0.tolist()) == list(range(96))
    assert not torch.equal(epoch0, epoch1)


def test_worker_view_matches_sampler_and_splits_microbatches():
    sampler = GlobalBatchSampler(dataset_size=50, global_batch_size=8, seed=1)
    view = ShardedBatches(sampler, rank=1, world_size=2, microbatch_size=2)
    for step in (0, 5, 6, 13):  # crosses an epoch boundary (6 steps per epoch)
        micro = view.microbatches(step)
        assert [len(m) for m in micro] == [2, 2]
        assert torch.equal(torch.cat(micro), sampler.shard_indices(step, 1, 2))


def test_order_depends_only_on_seed():
    a = GlobalBatchSampler(100, 10, seed=7).global_indices(4)
    b = GlobalBatchSampler(100, 10, seed=7).global_indices(4)
    c = GlobalBatchSampler(100, 10, seed=8).global_indices(4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dataset_smaller_than_batch():
    with pytest.raises(ConfigError, match="5 samples and global_batch_size=8"):
        GlobalBatchSampler(5, 8, 0)
