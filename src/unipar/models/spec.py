"""What the planner needs to know about a model besides its modules."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from unipar.analysis.meta import build_on_meta
from unipar.model_call import ModelCall


@dataclass(frozen=True)
class ModelSpec:
    """A model factory with one sample's input shape.

    ``input_dtype``: of the sample (token ids by default). ``hidden``: residual width
    (tells replicated from sharded tensors under tensor parallelism);
    ``tp_divisibility``: sizes the tensor-parallel degree must divide. ``loss`` and
    ``target``: the training loss and one target's shape and dtype, costed with the
    last layer (optional). ``seq_len``: the sequence length of attention (``None``: the
    tokens per sample when more than one), which tells the analysis attention scores
    apart; ``causal_attention``: a decoder's causal mask. ``sample`` and
    ``targets_sample``: one real sample where the inputs (or targets) are not one tensor
    (a dict of ``input_ids`` and ``attention_mask``); ``call``: how the model takes them.

    :attr:`meta_model` builds the model on the meta device once: the analysis, the
    embedding tables the planner prices and the checks of a plan against the model's
    layers all read that one build.
    """

    name: str
    factory: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    hidden: int | None = None
    tp_divisibility: tuple[tuple[str, int], ...] = ()
    tokens_per_sample: int = 1
    input_dtype: torch.dtype = torch.long
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    target: tuple[tuple[int, ...], torch.dtype] | None = None  # one target's shape, dtype
    seq_len: int | None = None
    causal_attention: bool = True
    # One sample's inputs and targets (batch of 1, any tree of tensors, on any device)
    # where they are not one tensor of ``sample_shape``; ``call``: model(inputs) or
    # model(**inputs).
    sample: Any = None
    targets_sample: Any = None
    call: ModelCall = ModelCall.POSITIONAL

    def sample_inputs(self) -> Any:
        """One sample's inputs (batch of 1) on the meta device."""
        if self.sample is None:
            return torch.zeros((1, *self.sample_shape), dtype=self.input_dtype, device="meta")
        return tree_map_only(torch.Tensor, lambda t: t.to("meta"), self.sample)

    def sample_targets(self) -> Any:
        """One sample's targets (batch of 1) on the meta device, or ``target``'s shape
        and dtype."""
        if self.targets_sample is None:
            return self.target
        return lambda: tree_map_only(torch.Tensor, lambda t: t.to("meta"), self.targets_sample)

    @property
    def attention_seq(self) -> int | None:
        if self.seq_len is not None:
            return self.seq_len
        if self.sample is not None:  # a tree of inputs: no one token tensor to read it from
            return None
        return self.tokens_per_sample if self.tokens_per_sample > 1 else None

    @functools.cached_property
    def meta_model(self) -> nn.Module:
        """``factory()`` on the meta device, built on first use and kept."""
        return build_on_meta(self.factory)
