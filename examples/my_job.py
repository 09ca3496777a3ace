"""A job file for the command line: ``unipar train examples/my_job.py --workers 2``.

It trains a small MLP to classify synthetic points by which of ten centres they came from.
Any file that defines ``job`` (a ``unipar.Job`` or a function returning one) works.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.data import Dataset

from unipar import Job, OptimizerSpec
from unipar.models import MLP, MLPConfig


class GaussianBlobs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Points around ``classes`` random centres; the label is the centre."""

    def __init__(self, size: int = 8192, features: int = 32, classes: int = 10) -> None:
        generator = torch.Generator().manual_seed(7)
        centres = torch.randn(classes, features, generator=generator) * 0.3
        self.labels = torch.randint(0, classes, (size,), generator=generator)
        self.points = centres[self.labels] + torch.randn(size, features, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.points[index], self.labels[index]


def job() -> Job:
    config = MLPConfig(in_features=32, hidden=128, layers=2, out_features=10)
    return Job(
        name="blobs-mlp",
        model=functools.partial(MLP, config),
        dataset=GaussianBlobs,
        loss=torch.nn.functional.cross_entropy,
        global_batch_size=64,
        steps=100,
        optimizer=OptimizerSpec(lr=1e-3),
    )
