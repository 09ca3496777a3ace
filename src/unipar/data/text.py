"""Byte-level text: every machine with Python has its standard library to learn from."""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from unipar.errors import ConfigError


def stdlib_corpus(max_bytes: int = 4_000_000, cache_dir: Path | None = None) -> Path:
    """Concatenate the standard library's ``.py`` files (sorted, tests excluded) into one
    cached byte file of at most ``max_bytes`` and return its path.

    Written to a temporary name and renamed, so workers that build it at the same
    time never read a half-written file.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha256(f"{root}|{max_bytes}|{sys.version}".encode()).hexdigest()
    cache_dir = cache_dir or Path.home() / ".cache" / "unipar"
    target = cache_dir / f"stdlib-{key[:16]}.bin"
    if target.exists():
        return target
    files = sorted(
        f for f in root.rglob("*.py") if not {"site-packages", "test", "tests"} & set(f.parts)
    )
    if not files:
        raise ConfigError(f"no .py files found under the standard library at {root}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    chunks, size = [], 0
    for f in files:
        data = f.read_bytes()
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".stdlib-")
    with os.fdopen(fd, "wb") as out:
        out.write(b"".join(chunks))
    os.replace(tmp, target)
    return target


class ByteTextDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``seq_len + 1`` bytes of a file.

    The file is memory-mapped: a worker touches only the pages of the samples it is
    given, so each worker reads only its own shard.
    """

    def __init__(self, path: str | os.PathLike[str], seq_len: int) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"text file {self.path} does not exist")
        self.seq_len = seq_len
        self._bytes = np.memmap(self.path, dtype=np.uint8, mode="r")

    def __len__(self) -> int:
        return max(0, (len(self._bytes) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.seq_len
        window = torch.from_numpy(np.array(self._bytes[start : start + self.seq_len + 1]))
        window = window.long()
        return window[:-1], window[1:]
