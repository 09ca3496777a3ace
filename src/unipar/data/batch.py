"""Batches as pytrees: inputs and targets may be a tensor, or a tuple, list or dict of
tensors, nested. The leading dimension of every tensor is the batch dimension: the
runtime splits a batch into micro-batches, data-parallel shares and pipeline chunks
along it, leaf by leaf (``torch.utils._pytree``, the trees ``torch.distributed.pipelining``
splits too).

A batch the runtime cannot split is refused with the key of the leaf at fault
(:func:`check_batch`): a leaf that is not a tensor (a string, ``None``), or a tensor
without the batch dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import (
    SequenceKey,
    keystr,
    tree_flatten,
    tree_flatten_with_path,
    tree_leaves,
    tree_map,
    tree_map_only,
)
from torch.utils.data import default_collate

from unipar.errors import ConfigError

Batch = tuple[Any, Any]  # (inputs, targets), each a pytree of tensors


def collate(samples: Sequence[Any], collate_fn: Callable[[list[Any]], Any] | None) -> Batch:
    """``samples`` (the dataset's ``(inputs, targets)`` pairs) as one batch, by the
    job's ``collate_fn`` (``None``: ``default_collate``); a clear error naming the key
    where samples cannot be stacked."""
    samples = list(samples)
    try:
        batch = (collate_fn or default_collate)(samples)
    except Exception as error:
        where = _uncollatable_key(samples) if collate_fn is None else None
        raise ConfigError(
            f"the job's samples cannot be collated into a batch"
            f"{f' at {where}' if where else ''} ({type(error).__name__}: {error}); every "
            "sample must hold tensors (or numbers) of the same shape at each key: pad "
            "sequences to one length, or give Job(collate=...)"
        ) from error
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ConfigError(
            f"a batch must be an (inputs, targets) pair, but collating gave a "
            f"{type(batch).__name__}; make the dataset yield (inputs, targets) pairs "
            "(or Job.collate return one)"
        )
    return batch[0], batch[1]


def _uncollatable_key(samples: list[Any]) -> str | None:
    """The first key where the samples' leaves differ in shape or are not collatable."""
    first, _ = tree_flatten_with_path(samples[0])
    for path, leaf in first:
        if leaf is None or isinstance(leaf, (str, bytes)):
            return _key(path)
        shapes = set()
        for sample in samples:
            try:
                value = _get(sample, path)
            except (KeyError, IndexError, TypeError):
                return _key(path)
            shapes.add(tuple(getattr(value, "shape", ())))
        if len(shapes) > 1:
            return f"{_key(path)} (shapes {sorted(shapes)})"
    return None


def _get(tree: Any, path: tuple) -> Any:
    for entry in path:
        tree = entry.get(tree)
    return tree


def _key(path: tuple) -> str:
    """A sample's key, read as the pair it is: ``inputs['input_ids']``."""
    head, *rest = path
    side = ("inputs", "targets")[head.idx] if isinstance(head, SequenceKey) else keystr((head,))
    return side + keystr(tuple(rest))


def check_batch(inputs: Any, targets: Any, size: int, *, named_inputs: bool = False) -> None:
    """Refuse a batch of ``size`` samples the runtime cannot split: a leaf that is not a
    tensor, or a tensor whose leading dimension is not the batch (``size``); with
    ``named_inputs`` (``model(**inputs)``), inputs that are not a dict."""
    if named_inputs and not (isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs)):
        raise ConfigError(
            f"Job(call='kwargs') calls model(**inputs), so the inputs must be a dict of named "
            f"tensors, but they are a {type(inputs).__name__}; yield ({{'input_ids': ...}}, "
            "targets) pairs, or leave call at 'positional' for model(inputs)"
        )
    for side, tree in (("inputs", inputs), ("targets", targets)):
        leaves, _ = tree_flatten_with_path(tree)
        if not leaves:
            raise ConfigError(f"the batch's {side} hold no tensor; give at least one")
        for path, leaf in leaves:
            key = side + keystr(_without_list_tail(path, leaf))
            if not isinstance(leaf, torch.Tensor):
                raise ConfigError(
                    f"batch leaf {key} is a {type(leaf).__name__} ({leaf!r:.40}), not a "
                    "tensor: the runtime splits every leaf of a batch along its first (batch) "
                    "dimension across micro-batches, replicas and pipeline stages; turn it "
                    "into a tensor in the dataset (token ids, not text), or leave it out"
                )
            if leaf.dim() == 0 or leaf.shape[0] != size:
                raise ConfigError(
                    f"batch leaf {key} has shape {tuple(leaf.shape)}, without the batch "
                    f"dimension: {size} samples collated must give a leading dimension of "
                    f"{size} on every leaf, which the runtime splits across micro-batches, "
                    "replicas and pipeline stages; give every sample its own row (stack it "
                    "per sample in Job.collate), or build it inside the model"
                )


def _without_list_tail(path: tuple, leaf: Any) -> tuple:
    """A non-tensor leaf's path up to the list holding it (``['text']``, not
    ``['text'][0]``): collating strings gives a list of them."""
    if isinstance(leaf, torch.Tensor):
        return path
    while path and isinstance(path[-1], SequenceKey):
        path = path[:-1]
    return path


def to_device(tree: Any, device: torch.device | str) -> Any:
    return tree_map_only(torch.Tensor, lambda t: t.to(device), tree)


def to_meta(tree: Any) -> Any:
    """``tree`` with every tensor on the meta device (shapes and dtypes kept)."""
    return to_device(tree, "meta")


def concat(trees: Sequence[Any]) -> Any:
    """Batches of one structure joined along the batch dimension, leaf by leaf."""
    if len(trees) == 1:
        return trees[0]
    return tree_map(lambda *leaves: torch.cat(leaves), *trees)


def rows(tree: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of a batch."""
    return tree_map_only(torch.Tensor, lambda t: t[start:stop], tree)


def first_tensor(tree: Any) -> torch.Tensor:
    return next(leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor))


def tokens_per_sample(targets: Any) -> int:
    """Tokens one sample trains on: the elements per sample of the targets' first
    tensor (a sequence of next tokens), 1 for a label."""
    first = first_tensor(targets)
    return first[0].numel() if first.dim() > 1 else 1


def same_structure(a: Any, b: Any) -> str | None:
    """Why two outputs differ in type, structure or shapes (``None``: they do not)."""
    leaves_a, spec_a = tree_flatten(a)
    leaves_b, spec_b = tree_flatten(b)
    if type(a) is not type(b):
        return f"{type(a).__name__} vs {type(b).__name__}"
    if spec_a != spec_b:
        return f"structure {spec_a} vs {spec_b}"
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) and tuple(x.shape) != tuple(y.shape):
            return f"shapes {tuple(x.shape)} vs {tuple(y.shape)}"
    return None
