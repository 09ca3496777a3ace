"""Small deterministic jobs for tests and benchmarks, importable by every worker."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, default_collate

from unipar.data.sampler import GlobalBatchSampler
from unipar.job import Job, OptimizerSpec
from unipar.models.gpt import GPT, GPTConfig
from unipar.models.llama import Llama, LlamaConfig
from unipar.models.mlp import MLP, MLPConfig


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


class RandomRegression(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` random feature vectors with targets from a fixed random linear map."""

    def __init__(self, size: int, in_features: int, out_features: int, seed: int = 1234) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, in_features, generator=generator)
        weight = torch.randn(in_features, out_features, generator=generator)
        self.targets = torch.tanh(self.inputs @ weight)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class SlowRegression(RandomRegression):
    """:class:`RandomRegression` whose every sample takes ``delay`` seconds to load (a stand-in
    for real data loading), so a data-parallel job runs faster on more workers.

    ``fast_once``: a file; once it exists, samples load at once. A test whose scenario
    (a worker lost, then one joining) needs slow steps writes it when the scenario is
    over, so that the run's remaining steps do not wait (the same samples either way)."""

    def __init__(self, size: int, in_features: int, out_features: int, delay: float,
                 seed: int = 1234, fast_once: str | None = None) -> None:
        super().__init__(size, in_features, out_features, seed=seed)
        self.delay, self.fast_once = delay, fast_once
        self._fast = False

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fast_once is not None and not self._fast:
            self._fast = os.path.exists(self.fast_once)
        if not self._fast:
            time.sleep(self.delay)
        return super().__getitem__(index)


def mse_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs, targets)


class UserBlock(nn.Module):
    """A residual MLP block as a user might write it (no unipar code in it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class UserModel(nn.Module):
    """A user's own model: input layer, a ``ModuleList`` of blocks, output layer, and a
    plain forward that does not know about pipeline stages."""

    def __init__(self, in_features: int = 16, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(UserBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def small_job(  # type: ignore[no-untyped-def]
    name: str, model, dataset, loss=None, steps: int = 10, batch: int = 8, **extra
) -> Job:
    """A job of ``steps`` steps of ``batch`` samples, Adam at 1e-3; ``extra``: other Job
    fields (``call``, ``collate``, ``step``)."""
    if loss is not None:
        extra["loss"] = loss
    return Job(
        name=name,
        model=model,
        dataset=dataset,
        global_batch_size=batch,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
        **extra,
    )


def tiny_llama_job(*, steps: int = 10, global_batch_size: int = 8) -> Job:
    config = LlamaConfig(
        vocab_size=64, seq_len=16, hidden=32, layers=2, heads=4, kv_heads=2, ffn_hidden=64
    )
    dataset = functools.partial(RandomTokens, 256, config.seq_len, config.vocab_size)
    return small_job(
        "tiny-llama", functools.partial(Llama, config), dataset, None, steps, global_batch_size
    )


def tiny_mlp_job(*, steps: int = 10, global_batch_size: int = 8) -> Job:
    config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
    dataset = functools.partial(RandomRegression, 256, 16, 4)
    return small_job(
        "tiny-mlp", functools.partial(MLP, config), dataset, mse_loss, steps, global_batch_size
    )


def user_model_job(*, steps: int = 10, global_batch_size: int = 8, model=UserModel) -> Job:  # type: ignore[no-untyped-def]
    dataset = functools.partial(RandomRegression, 256, 16, 4)
    return small_job("user-model", model, dataset, mse_loss, steps, global_batch_size)


def single_process_losses(
    job: Job, loss_of: Callable[[torch.nn.Module, Any, Any], torch.Tensor] | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final weights of ``job`` trained in this process on the
    whole global batch at once, with no unipar runtime involved: the reference that
    parity tests and benchmarks compare a distributed run's losses with.
    ``loss_of(model, inputs, targets)``: the step's loss (default: the job's loss of the
    model's output, the model called as the job says)."""
    if loss_of is None:

        def loss_of(model, inputs, targets):  # type: ignore[no-untyped-def]
            outputs = model(**inputs) if job.call.value == "kwargs" else model(inputs)
            return job.loss(outputs, targets)

    torch.manual_seed(job.seed)
    model = job.model()
    optimizer = job.build_optimizer(model.parameters())
    base = [g["lr"] for g in optimizer.param_groups]
    dataset = job.dataset()
    sampler = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed)
    losses = []
    for step in range(job.steps):
        for group, lr in zip(optimizer.param_groups, base, strict=True):
            group["lr"] = lr * job.lr_schedule.multiplier(step, job.steps)
        samples = [dataset[int(i)] for i in sampler.global_indices(step)]
        inputs, targets = (job.collate or default_collate)(samples)
        loss = loss_of(model, inputs, targets)
        loss.backward()
        if job.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model.state_dict()
