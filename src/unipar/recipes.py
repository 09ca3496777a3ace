"""Built-in jobs, runnable by name: ``unipar train gpt-stdlib``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from unipar.errors import ConfigError
from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind

if TYPE_CHECKING:  # the recipes import torch only when one is built
    from unipar.data.text import ByteTextDataset
    from unipar.job import Job


def _stdlib_text(seq_len: int) -> ByteTextDataset:
    from unipar.data.text import ByteTextDataset, stdlib_corpus  # noqa: PLC0415 (heavy: torch)

    return ByteTextDataset(stdlib_corpus(), seq_len)


def gpt_stdlib(steps: int = 200, global_batch_size: int = 32, seed: int = 0) -> Job:
    """A 0.8M-parameter byte-level GPT learning Python from the standard library."""
    from unipar.job import Job  # noqa: PLC0415 (heavy: torch)
    from unipar.models.gpt import GPT, GPTConfig  # noqa: PLC0415 (heavy: torch)

    config = GPTConfig(vocab_size=256, seq_len=128, hidden=128, layers=4, heads=4)
    return Job(
        name="gpt-stdlib",
        model=functools.partial(GPT, config),
        dataset=functools.partial(_stdlib_text, config.seq_len),
        global_batch_size=global_batch_size,
        steps=steps,
        optimizer=OptimizerSpec(lr=2e-3, weight_decay=0.1),
        lr_schedule=LRSchedule(ScheduleKind.WARMUP_COSINE, warmup_steps=max(1, steps // 20)),
        grad_clip_norm=1.0,
        seed=seed,
    )


RECIPES: dict[str, Callable[..., Job]] = {"gpt-stdlib": gpt_stdlib}


def recipe(name: str) -> Job:
    try:
        return RECIPES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown recipe {name!r}; built-in recipes: {', '.join(sorted(RECIPES))}, "
            "or pass the path of a Python file that defines `job`"
        ) from None
