"""Models from a Hugging Face ``transformers`` config (Llama, Qwen2, Mistral and GPT-2
families), built from the config alone: no weights are downloaded. On the meta device
a 405B model is built in about a second, for the planner.

For the analysis the model is seen through :class:`FlatCausalLM`, which lists the
embeddings, every decoder layer, the final norm and the output head as top-level
layers (the order they run in), so pipeline stages are runs of decoder layers and
identical layers are analysed once.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from unipar.errors import ConfigError
from unipar.models.spec import ModelSpec

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")


def load_config(source: str | Path | dict[str, Any]) -> Any:
    """A ``transformers`` config from a ``config.json`` path or its dict."""
    try:
        from transformers import AutoConfig  # noqa: PLC0415 (optional: transformers, the hf extra)
    except ImportError:
        raise ConfigError(
            "models from Hugging Face configs need transformers; install unipar[hf]"
        ) from None
    if isinstance(source, dict):
        values = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"no Hugging Face config at {str(path)!r}; give a config.json path")
        values = json.loads(path.read_text())
    family = values.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(
            f"model_type must be one of {list(FAMILIES)}, but the config says {family!r}"
        )
    values.pop("model_type")
    return AutoConfig.for_model(family, **values)


def hf_model(source: str | Path | dict[str, Any] | Any) -> nn.Module:
    """The causal language model of a config, with fresh weights on the current device
    (under ``torch.device('meta')``: no memory), attention through PyTorch's SDPA, in
    the config's dtype (``dtype``; float32 if it names none), so the
    analysis sees which ops the model upcasts to float32."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (optional: transformers)

    config = source if hasattr(source, "model_type") else load_config(source)
    config._attn_implementation = "sdpa"
    dtype = getattr(config, "dtype", None)  # transformers 5 reads a saved torch_dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)


class FlatCausalLM(nn.Module):
    """A ``transformers`` causal LM's modules as one flat sequence: token embedding
    (and GPT-2's position embedding), decoder layers, final norm, output head. Token
    ids [batch, seq] -> logits [batch, seq, vocab], as the wrapped model computes them
    without a padding mask (causal attention)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.family = model.config.model_type
        if self.family == "gpt2":
            base = model.transformer
            self.embed_tokens, self.embed_positions = base.wte, base.wpe
            self.layers, self.norm = base.h, base.ln_f
            self._rotary: tuple[nn.Module, ...] = ()
        else:
            base = model.model
            self.embed_tokens, self.embed_positions = base.embed_tokens, None
            self.layers, self.norm = base.layers, base.norm
            self._rotary = (base.rotary_emb,)  # a tuple: buffers only, not a layer
        self.lm_head = model.lm_head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None]
        h = self.embed_tokens(tokens)
        extra: dict[str, Any] = {}
        if self.embed_positions is not None:
            h = h + self.embed_positions(positions)
        else:
            extra["position_embeddings"] = self._rotary[0](h, position_ids=positions)
            extra["position_ids"] = positions
        for layer in self.layers:
            h = layer(h, attention_mask=None, **extra)
            h = h[0] if isinstance(h, tuple) else h  # transformers < 5 returns a tuple
        return self.lm_head(self.norm(h))


def _flat(config: Any) -> nn.Module:
    """The flat view of a config's model. On the meta device the model is built with
    one decoder layer and the rest are copies of it with parameters of their own
    (building 126 layers through ``transformers`` takes seconds; copying, tens of ms)."""
    if torch.empty(0).device.type != "meta":
        return FlatCausalLM(hf_model(config))
    small = copy.deepcopy(config)
    layers_key = "n_layer" if small.model_type == "gpt2" else "num_hidden_layers"
    count = getattr(small, layers_key)
    setattr(small, layers_key, 1)
    flat = FlatCausalLM(hf_model(small))
    first = flat.layers[0]
    flat.layers = nn.ModuleList([first, *(_meta_copy(first) for _ in range(count - 1))])
    return flat


def _meta_copy(module: nn.Module) -> nn.Module:
    """``module`` with new (meta) parameters and its own hooks; buffers shared."""
    clone = module.__class__.__new__(module.__class__)
    clone.__dict__ = {
        key: type(value)(value) if isinstance(value, dict) else value
        for key, value in module.__dict__.items()
    }
    clone._parameters = {
        name: None if p is None else nn.Parameter(torch.empty_like(p), p.requires_grad)
        for name, p in module._parameters.items()
    }
    clone._modules = {
        name: None if m is None else _meta_copy(m) for name, m in module._modules.items()
    }
    return clone


MAX_DEFAULT_SEQ = 8192  # a config's positions beyond this are long-context extensions


def hf_seq_reason(seq_len: int) -> str:
    """Why an HF config's model is planned at ``seq_len`` tokens when none was given."""
    if seq_len == MAX_DEFAULT_SEQ:
        return f"the config's positions, capped at {MAX_DEFAULT_SEQ}"
    return "the config's positions"


def hf_spec(source: str | Path | dict[str, Any], seq_len: int | None = None) -> ModelSpec:
    """The planner's view of a config's model on sequences of ``seq_len`` tokens (None:
    the config's positions, at most :data:`MAX_DEFAULT_SEQ`)."""
    config = load_config(source)
    family = config.model_type
    if family == "gpt2":
        hidden, heads, kv_heads = config.n_embd, config.n_head, config.n_head
        ffn = config.n_inner or 4 * hidden
        positions = config.n_positions
    else:
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        ffn, positions = config.intermediate_size, config.max_position_embeddings
    if seq_len is None:
        seq_len = min(positions, MAX_DEFAULT_SEQ)
    if seq_len > positions:
        raise ConfigError(
            f"seq_len must be at most the config's {positions} positions, but got {seq_len}"
        )
    return ModelSpec(
        name=f"{family}:{getattr(config, 'name_or_path', '') or 'config'}",
        factory=functools.partial(_flat, config),
        sample_shape=(seq_len,),
        hidden=hidden,
        tp_divisibility=(("heads", heads), ("kv_heads", kv_heads), ("ffn_hidden", ffn)),
        tokens_per_sample=seq_len,
        seq_len=seq_len,
        loss=_next_token_loss,
        target=((seq_len,), torch.long),
    )


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy of every position's logits (in fp32, as ``transformers`` computes
    the loss) against its target token."""
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
