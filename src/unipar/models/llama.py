"""A Llama-style decoder (Touvron et al. 2023): RMSNorm, SwiGLU MLP, grouped-query
attention, rotary position embeddings. Same layout as :mod:`unipar.models.gpt`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from unipar import checks
from unipar.errors import ConfigError
from unipar.models.spec import ModelSpec


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    seq_len: int = 128
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn_hidden: int = 344  # ~8/3 hidden, as in Llama
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        checks.positive_ints(
            type(self).__name__,
            (
                (n, getattr(self, n))
                for n in (
                    "vocab_size",
                    "seq_len",
                    "hidden",
                    "layers",
                    "heads",
                    "kv_heads",
                    "ffn_hidden",
                )
            ),
        )
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(
                f"heads must divide hidden and kv_heads must divide heads, but got "
                f"hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name="llama",
            factory=functools.partial(Llama, self),
            sample_shape=(self.seq_len,),
            hidden=self.hidden,
            tp_divisibility=(("kv_heads", self.kv_heads), ("ffn_hidden", self.ffn_hidden)),
            tokens_per_sample=self.seq_len,
        )


def rope_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, [seq, head_dim / 2] (Su et al. 2021)."""
    half = config.head_dim // 2
    freqs = config.rope_theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0
) -> torch.Tensor:
    """Rotate pairs of ``x`` [batch, heads, seq, head_dim] at positions ``offset`` on."""
    first, second = x[..., ::2], x[..., 1::2]
    cos, sin = cos[offset : offset + x.size(-2)], sin[offset : offset + x.size(-2)]
    rotated = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.groups = config.heads // config.kv_heads
        self.wq = nn.Linear(config.hidden, config.heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.heads * config.head_dim, config.hidden, bias=False)
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # the position of this input's first token (context parallelism sets it per rank)
        self.position_offset = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (
            w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        q = apply_rope(q, self.rope_cos, self.rope_sin, self.position_offset)
        k = apply_rope(k, self.rope_cos, self.rope_sin, self.position_offset)
        k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.hidden, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.feed_forward = SwiGLU(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_std) for every matrix, in a fixed order; unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.init_std)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h
