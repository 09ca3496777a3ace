"""Loading checkpoint files without running code from them.

A pickle can name any callable, which runs on load. PyTorch's ``weights_only=True``
loader accepts only tensors and plain containers; DCP's own reader, however, unpickles
its ``.metadata`` file freely and loads non-tensor entries with ``weights_only=False``
(torch 2.13, ``filesystem.py`` and ``default_planner.py``). The reader and planners here
close both doors: metadata is unpickled with an allow-list of DCP's own record types,
and every other object with ``weights_only=True``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from unipar.errors import CheckpointError

# Modules whose classes DCP writes into ``.metadata``: its records, torch's dtypes,
# sizes and memory formats. Nothing that runs code when constructed.
_METADATA_MODULES = frozenset(
    {
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
        "torch.distributed.checkpoint.planner",
    }
)
_TORCH_TYPES = frozenset({"Size", "device"})
_BUILTINS = frozenset({"set", "frozenset", "slice", "complex"})
_PATHS = frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"})


# What DCP's load raises: its CheckpointException derives from BaseException.
LOAD_ERRORS = (Exception, CheckpointException)


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file names code to run on load; it was refused, nothing ran."""


class _Forbidden(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list."""


# How torch's weights-only unpickler says a pickle names code (rather than that the file
# is damaged): torch/_weights_only_unpickler.py.
_NAMES_CODE = re.compile(r"GLOBAL (\S+)|unrecognized function|Unsupported class")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module in _METADATA_MODULES
            or (module == "torch" and (name in _TORCH_TYPES or _is_dtype(name)))
            or (module == "builtins" and name in _BUILTINS)
            or (module == "collections" and name == "OrderedDict")
            or (module == "torch.serialization" and name == "_get_layout")
            or (module == "pathlib" and name in _PATHS)
        )
        if not allowed:
            raise _Forbidden(f"it names {module}.{name}")
        return super().find_class(module, name)


def _is_dtype(name: str) -> bool:
    return isinstance(getattr(torch, name, None), torch.dtype)


def _refuse(path: object, error: Exception) -> UnsafeCheckpointError:
    named = _NAMES_CODE.search(str(error))
    if named:
        reason = f"it names {named.group(1)}" if named.group(1) else named.group(0)
    else:
        reason = str(error)
    return UnsafeCheckpointError(
        f"refused to load {path}: it holds more than tensors and plain data ({reason}); "
        "a checkpoint never needs code to load, so this file was crafted or written by "
        "another program. Nothing in it was run; resume from a checkpoint unipar wrote"
    )


def safe_torch_load(path: str | os.PathLike[str] | io.BytesIO, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors, numbers, strings and
    containers only; anything else raises :class:`UnsafeCheckpointError`."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as error:
        if not _NAMES_CODE.search(str(error)):
            raise  # a damaged file, not a crafted one: the caller reports it
        where = path if isinstance(path, (str, os.PathLike)) else "an entry of a DCP checkpoint"
        raise _refuse(where, error) from None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, with ``.metadata`` unpickled through an allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            try:
                metadata = _MetadataUnpickler(stream).load()
            except _Forbidden as error:
                raise _refuse(path, error) from None
        if not isinstance(metadata, Metadata):
            raise _refuse(path, TypeError(f"a {type(metadata).__name__}, not DCP metadata"))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes_safely(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> Any:
    loaded = safe_torch_load(value)
    fqn = read_item.dest_index.fqn
    if planner.flatten_state_dict:
            set_element(planner.original_state_dict, planner.mappings[fqn], loaded)
    else:
        planner.state_dict[fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner; non-tensor entries load with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes_safely(self, read_item, value)


class _SafeEmptyStateDictPlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes_safely(self, read_item, value)


def load_full_state_dict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A whole DCP checkpoint as one (unsharded) state dict, in this process, safely
    (what ``dcp_to_torch_save`` builds, without its unsafe loads and temporary file)."""
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=SafeFileSystemReader(str(path)),
        planner=_SafeEmptyStateDictPlanner(),
        no_dist=True,
    )
    return state


def raise_if_unsafe(error: BaseException) -> None:
    """Re-raise the :class:`UnsafeCheckpointError` behind ``error``, which DCP wraps in
    its own ``CheckpointException`` (one failure per rank)."""
    seen: list[BaseException | None] = [error]
    visited: set[int] = set()
    while seen:
        current = seen.pop()
        if current is None or id(current) in visited:
            continue
        visited.add(id(current))
        if isinstance(current, UnsafeCheckpointError):
            raise current from None
        for failure in getattr(current, "failures", {}).values():
            seen.append(failure[0] if isinstance(failure, tuple) else failure)
        seen += [current.__cause__, current.__context__]


def describe_load_error(error: BaseException) -> str:
    """``Type: message`` of what went wrong, the first rank's for DCP's wrapped errors
    (whose own text is a multi-rank traceback)."""
    failures = getattr(error, "failures", None)
    if isinstance(error, CheckpointException) and failures:
        first = next(iter(failures.values()))
        error = first[0] if isinstance(first, tuple) else first
    return f"{type(error).__name__}: {error}"
