"""Checkpoints with ``torch.distributed.checkpoint`` (DCP), written atomically.

Layout of a checkpoint directory::

    step_00000040/            a complete checkpoint (renamed into place last)
        .metadata, *.distcp   DCP: model and optimizer state, resharded on load
        rng_rank{r}.pt        each rank's random number generator states
        unipar_state.json     step, world size, plan, data position
    .step_00000050.partial/   being written; ignored, removed by the next save

Every rank writes into the ``.partial`` directory; rank 0 renames it to its final
name only after all ranks finished, so a crash while writing never damages the last
good checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from unipar.errors import CheckpointError

STATE_FILE = "unipar_state.json"
_PREFIX = "step_"


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    world_size: int
    global_batch_size: int
    plan: dict[str, Any]


def _dcp() -> ModuleType:
    """``torch.distributed.checkpoint``, imported on first use: it takes over a second to
    import, which would otherwise delay every worker's first step."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415 (heavy: torch.distributed.checkpoint)
    import torch.distributed.checkpoint.state_dict  # noqa: F401, PLC0415 (heavy: torch.distributed.checkpoint)

    return dcp


def _safe() -> ModuleType:
    """:mod:`unipar.runtime.safe_load`, imported with DCP on first use."""
    from unipar.runtime import safe_load  # noqa: PLC0415 (heavy: torch.distributed.checkpoint)

    return safe_load


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Check that ``path`` holds a complete, readable checkpoint and describe it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"no checkpoint at {path}: the directory does not exist; pass the directory of a "
            f"checkpoint (a {_PREFIX}NNNNNNNN folder) or a checkpoint directory that holds one"
        )
    try:
        state = json.loads((path / STATE_FILE).read_text())
        _safe().SafeFileSystemReader(str(path)).read_metadata()
        return CheckpointInfo(
            path=path,
            step=int(state["step"]),
            world_size=int(state["world_size"]),
            global_batch_size=int(state["global_batch_size"]),
            plan=state["plan"],
        )
    except CheckpointError:
        raise
    except Exception as error:  # any failure to read it means it is not usable
        raise CheckpointError(
            f"checkpoint at {path} is incomplete or corrupt ({type(error).__name__}: {error}); "
            "resume from an earlier checkpoint in the same directory, or start afresh in an "
            "empty directory"
        ) from error


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest first (partial ones are skipped)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        p
        for p in directory.iterdir()
        if p.is_dir() and p.name.startswith(_PREFIX) and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def resolve_resume_path(path: str | os.PathLike[str]) -> CheckpointInfo:
    """A checkpoint itself, or a checkpoint directory whose newest checkpoint is taken."""
    path = Path(path)
    if path.is_dir() and not (path / STATE_FILE).exists():
        newest = latest_checkpoint(path)
        if newest is None:
            raise CheckpointError(
                f"cannot resume: {path} holds no complete checkpoint "
                f"(no {_PREFIX}NNNNNNNN folder with {STATE_FILE}); start without resume"
            )
        path = newest
    return read_checkpoint(path)


def resume_point(resume: bool | Path, checkpoints: Path) -> Path | None:
    """The checkpoint a run starts from (``resume``: ``False``, ``True`` for the newest
    in ``checkpoints``, or a path), checked now; refuses to overwrite old checkpoints."""
    if resume is True:
        return resolve_resume_path(checkpoints).path
    if resume:
        return resolve_resume_path(resume).path
    existing = list_checkpoints(checkpoints)
    if existing:
        raise CheckpointError(
            f"checkpoint directory {checkpoints} already holds checkpoints (newest: "
            f"{existing[-1].name}); pass resume=True (--resume) to continue that run, or "
            "choose another directory so they are not overwritten"
        )
    return None


def ensure_writable(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` if needed and prove a file can be written there."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as error:
        raise CheckpointError(
            f"checkpoint directory {directory} is not writable ({error.strerror or error}); "
            "choose a directory you can write to with checkpoint_dir / --checkpoint-dir"
        ) from error
    return directory


def _rng_states() -> dict[str, Any]:
    """Every generator's state as tensors, numbers, strings and lists only, so that it
    loads with ``torch.load(weights_only=True)``."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, keys.tolist(), position, has_gauss, cached_gaussian],
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state(
        (name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian)
    )
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _state_dicts(
    parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]
) -> tuple[dict[str, Any], list[tuple[set[str], set[str]]]]:
    """Model and optimizer state of every part, keyed by parameter name (the names of
    the whole single-device model, whatever the plan), and each part's own keys.

    The optimizer state is flattened to one entry per parameter, so any plan's
    checkpoint loads under any other plan (DCP reshards each tensor)."""
    dcp = _dcp()
    options = dcp.state_dict.StateDictOptions(flatten_optimizer_state_dict=True)
    model_state: dict[str, Any] = {}
    optimizer_state: dict[str, Any] = {}
    keys = []
    for part, optimizer in zip(parts, optimizers, strict=True):
        part_model, part_optimizer = dcp.state_dict.get_state_dict(part, optimizer, options=options)
        model_state.update(part_model)
        optimizer_state.update(part_optimizer)
        keys.append((set(part_model), set(part_optimizer)))
    return {"model": model_state, "optimizer": optimizer_state}, keys


def _set_state_dicts(
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    state: dict[str, Any],
    keys: list[tuple[set[str], set[str]]],
) -> None:
    """Put loaded ``state`` (as laid out by :func:`_state_dicts`) into each part."""
    dcp = _dcp()
    options = dcp.state_dict.StateDictOptions(flatten_optimizer_state_dict=True)
    for part, optimizer, (model_keys, optimizer_keys) in zip(parts, optimizers, keys, strict=True):
        dcp.state_dict.set_state_dict(
            part,
            optimizer,
            model_state_dict={k: state["model"][k] for k in model_keys},
            optim_state_dict={k: state["optimizer"][k] for k in optimizer_keys},
            options=options,
        )


@contextmanager
def _one_process_is_meant() -> Iterator[None]:
    """DCP warns on every save and load without a process group ("assuming the intent is
    to save in a single process"): a one-worker run means exactly that, so its users are
    not told so at each checkpoint. With a group, nothing is filtered."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings(
                "ignore",
                message="torch.distributed is disabled, unavailable or uninitialized",
                category=UserWarning,
            )
        yield


def save_checkpoint(
    directory: Path,
    *,
    step: int,
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Collective: every rank calls it, with the model parts it holds (one, or several
    pipeline stages) and one optimizer per part. Returns the final checkpoint path."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    final = directory / checkpoint_name(step)
    partial = directory / f".{final.name}.partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    dcp = _dcp()
    state_dict, _ = _state_dicts(parts, optimizers)
    with _one_process_is_meant():
        dcp.save(state_dict, checkpoint_id=str(partial))
    torch.save(_rng_states(), partial / f"rng_rank{rank}.pt")
    _barrier()
    if rank == 0:
        _write_json(partial / STATE_FILE, {"step": step, **state})
        if final.exists():  # a re-run of the same step after a restart
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync_dir(directory)
        for old in list_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path,
    *,
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
) -> None:
    """Collective: load model and optimizer state, resharded to this rank's parts (the
    checkpoint may come from another plan), and, when the world size is unchanged, this
    rank's random number generator states."""
    info = read_checkpoint(path)
    dcp = _dcp()
    safe = _safe()
    state, keys = _state_dicts(parts, optimizers)
    try:
        with _one_process_is_meant():
            dcp.load(
                state,
                storage_reader=safe.SafeFileSystemReader(str(path)),
                planner=safe.SafeLoadPlanner(),
            )
    except safe.LOAD_ERRORS as error:
        safe.raise_if_unsafe(error)
        raise CheckpointError(
            f"could not load checkpoint {path} into this model "
            f"({safe.describe_load_error(error)}); resume with the model it was written for, "
            "or start afresh"
        ) from error
    _set_state_dicts(parts, optimizers, state, keys)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng_file = path / f"rng_rank{rank}.pt"
    if info.world_size == world_size and rng_file.exists():
        try:
            states = safe.safe_torch_load(rng_file)
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(
                f"checkpoint at {path} is incomplete or corrupt: {rng_file.name} cannot be "
                f"read ({type(error).__name__}: {str(error).splitlines()[0]}); resume from an "
                "earlier checkpoint in the same directory, or start afresh"
            ) from error
        _set_rng_states(states)


def load_model_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict from a checkpoint, in one process.
    Loading runs no code from the checkpoint (:mod:`unipar.runtime.safe_load`)."""
    info = resolve_resume_path(path)
    safe = _safe()
    try:
        return safe.load_full_state_dict(info.path)["model"]
    except safe.LOAD_ERRORS as error:
        safe.raise_if_unsafe(error)
        raise CheckpointError(
            f"could not read the model state of checkpoint {info.path} "
            f"({safe.describe_load_error(error)}); pass a checkpoint unipar wrote"
        ) from error


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
