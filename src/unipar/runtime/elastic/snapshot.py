"""In-memory checkpoints: DCP written to bytes instead of files.

A resize moves the training state from the workers that have it to the gang that
needs it without touching a disk. The state is written with
``torch.distributed.checkpoint`` (DCP) exactly as a disk checkpoint is (same keys: the
single-device parameter names, optimizer state flattened per parameter), but through
fsspec's ``memory://`` filesystem; each rank then hands the bytes it wrote back to the
controller as the return value of a Ray call, so the controller (the driver) owns them
in Ray's object store and they outlive the worker that wrote them. A new gang, under
another plan and world size, loads them with DCP's resharding, as a disk resume does.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import fsspec
import torch
import torch.distributed as dist
from torch import nn

from unipar.runtime.checkpoint import _dcp, _set_state_dicts, _state_dicts

_ROOT = "/unipar-snapshots"
_counter = itertools.count()


@dataclass(frozen=True)
class SnapshotPart:
    """The files one rank wrote for the in-memory checkpoint of ``step``."""

    step: int
    rank: int
    files: dict[str, bytes]

    @property
    def nbytes(self) -> int:
        return sum(len(data) for data in self.files.values())


class SnapshotAssembly:
    """The parts of one gang's snapshots as they arrive, one per rank and step; a step's
    snapshot is whole once every one of the gang's ``size`` ranks sent its part (a rank
    that snapshots one step twice, on its cadence and before a pause, counts once)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._parts: dict[int, dict[int, SnapshotPart]] = {}

    def add(self, part: SnapshotPart) -> list[SnapshotPart] | None:
        """The whole snapshot of ``part.step`` (parts in rank order) once this part
        completes it, else ``None``; older incomplete steps are then dropped."""
        ranks = self._parts.setdefault(part.step, {})
        ranks[part.rank] = part
        if len(ranks) < self.size:
            return None
        del self._parts[part.step]
        for step in [s for s in self._parts if s < part.step]:
            del self._parts[step]
        return [ranks[rank] for rank in sorted(ranks)]


def _memory_fs():  # type: ignore[no-untyped-def]
    return fsspec.filesystem("memory")


def _scratch() -> str:
    return f"{_ROOT}/{os.getpid()}-{next(_counter)}"


def save_to_memory(
    step: int,
    rank: int,
    *,
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    collective: bool,
) -> SnapshotPart:
    """This rank's share of a DCP checkpoint of ``parts``/``optimizers``, as bytes.

    ``collective``: every rank of the current process group calls it (sharded state);
    otherwise one process writes its own, complete state (a data-parallel replica)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # noqa: PLC0415 (heavy: torch.distributed.checkpoint)

    dcp = _dcp()
    state, _ = _state_dicts(parts, optimizers)
    # Scratch paths must be equal on every rank of a collective save (rank 0 writes the
    # metadata into the same directory).
    where = f"{_ROOT}/step-{step}" if collective else _scratch()
    writer = FsspecWriter(f"memory://{where}", sync_files=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        dcp.save(state, storage_writer=writer, no_dist=not collective)
    return SnapshotPart(step=step, rank=rank, files=_take_files(where))


def _take_files(where: str) -> dict[str, bytes]:
    fs = _memory_fs()
    paths = fs.find(where)
    files = {path.rsplit("/", 1)[1]: fs.cat_file(path) for path in paths}
    fs.rm(where, recursive=True)
    return files


def load_from_memory(
    snapshot: Sequence[SnapshotPart],
    *,
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    collective: bool,
) -> None:
    """Load the state of a snapshot (all its ranks' parts) into this rank's ``parts``,
    resharded to the current plan."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # noqa: PLC0415 (heavy: torch.distributed.checkpoint)

    dcp = _dcp()
    fs = _memory_fs()
    where = _scratch()
    for part in snapshot:
        for name, data in part.files.items():
            fs.pipe_file(f"{where}/{name}", data)
    try:
        state, keys = _state_dicts(parts, optimizers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                state, storage_reader=FsspecReader(f"memory://{where}"), no_dist=not collective
            )
        _set_state_dicts(parts, optimizers, state, keys)
    finally:
        fs.rm(where, recursive=True)


class SnapshotCadence:
    """When a rank snapshots: every ``every`` steps, or, with ``every=None``, as often
    as ``budget`` of the training time allows. The adaptive interval is
    ``ceil(snapshot_s / (budget * step_s))`` from the last snapshot's duration and the
    mean step since the one before (the largest of every rank's, so all ranks agree:
    the snapshot is collective): a loss then redoes at most ``1 / budget`` times one
    snapshot's duration of training. The first snapshot comes after ``first`` steps."""

    def __init__(self, every: int | None, *, start: int, budget: float = 0.02, first: int = 10):
        self.every, self.budget = every, budget
        self.next_at = start + (every if every else first)
        self._since = start
        self._step_seconds = 0.0

    def add_step(self, seconds: float) -> None:
        self._step_seconds += seconds

    def due(self, step: int) -> bool:
        return self.every != 0 and step >= self.next_at

    def took(self, step: int, snapshot_s: float) -> None:
        """Record a snapshot at ``step`` that took ``snapshot_s`` seconds."""
        steps = max(1, step - self._since)
        if self.every:
            interval = self.every
        else:
            snapshot_s, step_s = _largest_on_any_rank(snapshot_s, self._step_seconds / steps)
            interval = max(1, min(10_000, math.ceil(snapshot_s / (self.budget * step_s))))
        self.next_at = step + interval
        self._since, self._step_seconds = step, 0.0


def _largest_on_any_rank(*values: float) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [max(v, 1e-9) for v in tensor.tolist()]
