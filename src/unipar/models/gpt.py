"""A GPT language model in the Megatron-LM layout (Shoeybi et al. 2019).

Learned position embeddings, pre-LayerNorm blocks, GELU MLP of ``mlp_ratio * hidden``,
optionally tied input and output embeddings. Query, key and value are separate
projections and the blocks live in a ``ModuleDict`` keyed by index, so tensor
parallelism can split heads and pipeline stages can drop blocks without renaming
parameters (the layout torchtitan uses).
"""

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
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 128
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        checks.positive_ints(
            type(self).__name__,
            (
                (n, getattr(self, n))
                for n in ("vocab_size", "seq_len", "hidden", "layers", "heads", "mlp_ratio")
            ),
        )
        checks.number("GPTConfig.dropout", self.dropout, minimum=0, below=1)
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden must be divisible by heads, but got hidden={self.hidden}, "
                f"heads={self.heads}; choose heads among the divisors of {self.hidden}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name="gpt",
            factory=functools.partial(GPT, self),
            sample_shape=(self.seq_len,),
            hidden=self.hidden,
            tp_divisibility=(("heads", self.heads),),
            tokens_per_sample=self.seq_len,
        )


class Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.hidden, config.hidden)
        self.wk = nn.Linear(config.hidden, config.hidden)
        self.wv = nn.Linear(config.hidden, config.hidden)
        self.wo = nn.Linear(config.hidden, config.hidden)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds hidden/tp columns.
        q, k, v = (
            w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        drop = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.hidden, config.mlp_ratio * config.hidden)
        self.proj = nn.Linear(config.mlp_ratio * config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden)
        self.attention = Attention(config)
        self.mlp_norm = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x)))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class GPT(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.position_offset = 0  # the first token's position (context parallelism)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.pos_embeddings = nn.Embedding(config.seq_len, config.hidden)
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.norm = nn.LayerNorm(config.hidden)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_std) weights, zero biases, unit norms, in a fixed order.

        Output projections of each block are scaled by 1/sqrt(2 * layers)
        (GPT-2, Radford et al. 2019, Section 2.3).
        """
        std = self.config.init_std
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, std=std)
        if self.pos_embeddings is not None:
            nn.init.normal_(self.pos_embeddings.weight, std=std)
        for block in self.layers.values():
            for name, module in block.named_modules():
                if isinstance(module, nn.Linear):
                    scale = (2 * self.config.layers) ** -0.5 if name.endswith(("wo", "proj")) else 1
                    nn.init.normal_(module.weight, std=std * scale)
                    nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
        if self.norm is not None:
            nn.init.ones_(self.norm.weight)
            nn.init.zeros_(self.norm.bias)
        if self.output is not None and not self.config.tie_embeddings:
            nn.init.normal_(self.output.weight, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            first = self.position_offset  # context parallelism: this rank's first token
            positions = torch.arange(first, first + tokens.size(1), device=tokens.device)
            h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h
