"""Hugging Face ``transformers`` models: what unipar needs to know beyond their modules.

Nothing here imports ``transformers``: a model is recognised by its classes' names, so
unipar runs without the package and a model built from it needs no special wrapper.

- :func:`is_hf_model`: a ``PreTrainedModel``.
- :func:`hf_model_facts`: residual width and the sizes tensor parallelism must divide
  (heads, key/value heads, MLP width, vocabulary), read from the model's config.
- :func:`stage_forward`: a pipeline stage runs the model's own forward (masks, position
  ids, rotary tables, cache off) on token ids (first stage) or on the previous stage's
  hidden states passed as ``inputs_embeds``; the stage returns one tensor.
- :class:`ZeroEmbedding`: stands in for a position embedding on later stages (GPT-2
  adds ``wpe(position_ids)`` to ``inputs_embeds`` on every call).
- :func:`is_conv1d`, :func:`fused_qkv_attention`: GPT-2's ``Conv1D`` (weight stored
  (in, out), transposed against ``nn.Linear``) and its fused ``c_attn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from unipar.errors import UnsupportedPlanError

COVERED_FAMILIES = ("llama", "mistral", "qwen2", "gpt2")


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers.PreTrainedModel`` (any version)."""
    return any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)


def is_conv1d(module: nn.Module) -> bool:
    """GPT-2's ``transformers.pytorch_utils.Conv1D``: ``y = x @ weight + bias`` with
    ``weight`` of shape (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


@dataclass(frozen=True)
class ModelFacts:
    hidden: int
    tp_divisibility: tuple[tuple[str, int], ...]


def _config_value(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def hf_model_facts(model: nn.Module) -> ModelFacts | None:
    """Residual width and the sizes tensor parallelism must divide, from the config of
    an HF model (``None`` for other models)."""
    if not is_hf_model(model):
        return None
    config = model.config
    hidden = _config_value(config, "hidden_size", "n_embd", "d_model")
    if hidden is None:
        return None
    heads = _config_value(config, "num_attention_heads", "n_head")
    sizes = {
        "num_attention_heads": heads,
        "num_key_value_heads": _config_value(config, "num_key_value_heads") or heads,
        "intermediate_size": _config_value(config, "intermediate_size", "n_inner"),
        "vocab_size": _config_value(config, "vocab_size"),
    }
    return ModelFacts(hidden, tuple((k, v) for k, v in sizes.items() if v))


def check_heads(model: nn.Module, tp: int) -> None:
    """Tensor parallelism gives each rank whole heads: tp must divide the number of
    attention heads and of key/value heads (grouped-query attention)."""
    facts = hf_model_facts(model)
    if facts is None:
        return
    for what, size in facts.tp_divisibility:
        if what in ("num_attention_heads", "num_key_value_heads") and size % tp:
            raise UnsupportedPlanError(
                f"tensor parallel gives each rank whole heads, but {type(model).__name__} "
                f"has {what}={size}, which tp={tp} does not divide; choose a tp that "
                f"divides {size}, or use dp, fsdp and pp (plans with tp=1)"
            )


def disable_cache(model: nn.Module) -> nn.Module:
    """Training keeps no key/value cache (``use_cache=False``), as HF's own trainer."""
    config = getattr(model, "config", None)
    if is_hf_model(model) and getattr(config, "use_cache", False):
        config.use_cache = False
    return model


def output_tensor(output: Any) -> torch.Tensor:
    """The tensor a model output carries: ``.logits`` of a ``ModelOutput``, else its
    last hidden state, else the first field; a tensor is returned as it is."""
    if isinstance(output, torch.Tensor):
        return output
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return output[0]


def stage_forward(forward: Callable[..., Any], *, outermost: bool) -> Callable[..., Any]:
    """The forward of an HF model in one pipeline stage (the other stages' layers
    replaced by pass-throughs), ``forward`` being its own: token ids in on the first
    stage, the previous stage's hidden states (floating point) as ``inputs_embeds`` on
    the others, cache off. ``outermost``: the model is the stage itself, which returns
    one tensor (else it sits inside the user's model, whose forward reads its output)."""

    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        key = "inputs_embeds" if x.is_floating_point() else "input_ids"
        output = forward(*args, **{key: x, **kwargs, "use_cache": False})
        return output_tensor(output) if outermost else output

    return run


class ZeroEmbedding(nn.Module):
    """An embedding table held by another pipeline stage: adds nothing (zeros)."""

    def __init__(self, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.dtype = dim, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros((*ids.shape, self.dim), dtype=self.dtype, device=ids.device)


def fused_qkv_attention(block: nn.Module, path: str) -> nn.Module | None:
    """The attention module owning ``path`` when ``path`` is a fused query/key/value
    ``Conv1D`` (GPT-2's ``c_attn``: output ``[q | k | v]``, each ``split_size`` wide)."""
    parent_path, _, leaf = path.rpartition(".")
    parent = block.get_submodule(parent_path) if parent_path else block
    if leaf == "c_attn" and hasattr(parent, "split_size") and hasattr(parent, "num_heads"):
        return parent
    return None


def shard_attention_heads(attention: nn.Module, tp: int) -> None:
    """After tensor parallel: this rank computes ``num_heads / tp`` heads, so the fused
    output it splits into q, k, v is ``split_size / tp`` wide per part."""
    attention.split_size //= tp
    attention.num_heads //= tp
    if hasattr(attention, "embed_dim"):
        attention.embed_dim //= tp
