"""The demo's byte-level GPT, as the benchmarks train it.

``job()`` is what both sides of ddp_vs_torchrun.py train (``unipar train
benchmarks/workload.py`` runs it; the torchrun baseline imports it). ``gpt_train`` and
``gpt_held_out`` split the standard library's text windows: the first nine tenths to train
on, a fixed sample of the last tenth to measure a held-out loss on (tune_asha.py,
adaptive_batch.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unipar.job import Job
from unipar.recipes import gpt_stdlib

if TYPE_CHECKING:  # torch is imported when a data set is built, not with this module
    from torch.utils.data import Dataset


def job() -> Job:
    return gpt_stdlib(steps=60, global_batch_size=32)


def _stdlib_windows(seq_len: int):  # type: ignore[no-untyped-def]
    from unipar.data.text import ByteTextDataset, stdlib_corpus

    return ByteTextDataset(stdlib_corpus(), seq_len)


def gpt_train(seq_len: int) -> Dataset:
    from torch.utils.data import Subset

    windows = _stdlib_windows(seq_len)
    return Subset(windows, range(len(windows) * 9 // 10))


def gpt_held_out(seq_len: int, count: int = 96) -> Dataset:
    from torch.utils.data import Subset

    windows = _stdlib_windows(seq_len)
    start = len(windows) * 9 // 10
    step = max(1, (len(windows) - start) // count)
    return Subset(windows, range(start, len(windows), step)[:count])
