"""Datasets and the deterministic sampler."""

from unipar.data.sampler import GlobalBatchSampler, ShardedBatches
from unipar.data.text import ByteTextDataset, stdlib_corpus

__all__ = ["ByteTextDataset", "GlobalBatchSampler", "ShardedBatches", "stdlib_corpus"]
