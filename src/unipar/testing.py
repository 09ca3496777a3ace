"""Small deterministic jobs for tests and benchmarks, importable by every worker."""

from __future__ import annotations

import functools

import torch
from torch.utils.data import Dataset

from unipar.job import Job, OptimizerSpec
from unipar.models.gpt import GPT, GPTConfig


class RandomTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` fixed random token sequences (inputs and next-token targets)."""

    def __init__(self, size: int, seq_len: int, vocab_size: int, seed: int = 1234) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab_size, (size, seq_len + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[index]
        return row[:-1], row[1:]


def _failing_model() -> torch.nn.Module:
    raise RuntimeError("model factory failed on purpose")


def tiny_gpt_config(dropout: float = 0.0) -> GPTConfig:
    return GPTConfig(vocab_size=64, seq_len=16, hidden=32, layers=2, heads=2, dropout=dropout)


def tiny_gpt_job(
    *,
    steps: int = 20,
    global_batch_size: int = 8,
    dataset_size: int = 256,
    dropout: float = 0.0,
    seed: int = 0,
    failing_model: bool = False,
    config: GPTConfig | None = None,
) -> Job:
    config = config or tiny_gpt_config(dropout)
    return Job(
        name="tiny-gpt",
        model=_failing_model if failing_model else functools.partial(GPT, config),
        dataset=functools.partial(RandomTokens, dataset_size, config.seq_len, config.vocab_size),
        global_batch_size=global_batch_size,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
        seed=seed,
    )
