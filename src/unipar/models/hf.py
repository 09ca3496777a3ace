"""Hugging Face ``transformers`` models: what unipar needs to know beyond their modules.

Nothing here imports ``transformers``: a model is recognised by its classes' names, so
unipar runs without the package and a model built from it needs no special wrapper.

- :func:`is_hf_model`: a ``PreTrainedModel``.
- :func:`hf_model_facts`: residual width and the sizes tensor parallelism must divide
  (heads, key/value heads, MLP width, vocabulary), read from the model's config.
- :func:`tp_plan`: the model's own tensor-parallel plan (``_tp_plan``, or its config's
  ``base_model_tp_plan``), which the runtime follows where the model has one.
- :func:`is_conv1d`, :func:`fused_qkv_attention`: GPT-2's ``Conv1D`` (weight stored
  (in, out), transposed against ``nn.Linear``) and its fused ``c_attn``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

from unipar.errors import UnsupportedPlanError

COVERED_FAMILIES = ("llama", "mistral", "qwen2", "gpt2")


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers.PreTrainedModel`` (any version)."""
    return any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The tensor-parallel plan a ``transformers`` model declares for itself, for
    ``model`` and any such model inside it: ``{module path pattern ('*' for a layer
    index), from ``model``: style ('colwise', 'rowwise', 'embedding_rowwise',
    'colwise_gather_output', ...)}``, read from each model's ``_tp_plan`` (which
    ``transformers`` fills from its config's ``base_model_tp_plan``), else from the
    config. Empty where none declares one (GPT-2, BERT)."""
    plan: dict[str, str] = {}
    for prefix, module in model.named_modules():
        if not is_hf_model(module):
            continue
        entries = dict(getattr(module, "_tp_plan", None) or {})
        if not entries:
            base = getattr(getattr(module, "config", None), "base_model_tp_plan", None) or {}
            inner = getattr(module, "base_model_prefix", "")
            lead = f"{inner}." if inner and hasattr(module, inner) else ""
            entries = {f"{lead}{key}": style for key, style in base.items()}
        for key, style in entries.items():
            plan.setdefault(f"{prefix}.{key}" if prefix else key, style)
    return plan


def declared_style(plan: dict[str, str], path: str) -> str | None:
    """The style ``plan`` (:func:`tp_plan`) gives the module at ``path``, if any."""
    for pattern, style in plan.items():
        if re.fullmatch(re.escape(pattern).replace(r"\*", r"[^.]+"), path):
            return style
    return None


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
    an HF model, or of the first one inside the user's model (``None`` for others)."""
    inner = next((module for module in model.modules() if is_hf_model(module)), None)
    if inner is None:
        return None
    config = inner.config
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
    """Training keeps no key/value cache (``use_cache=False``, as HF's own trainer), for
    a Hugging Face model and for one inside the user's model."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if is_hf_model(module) and getattr(config, "use_cache", False):
            config.use_cache = False
    return model


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
