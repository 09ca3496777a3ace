"""Published Llama 3 sizes as :class:`LlamaConfig` (Dubey et al. 2024, "The Llama 3
Herd of Models", Table 3: layers, model and FFN dimension, attention and key/value
heads; vocabulary 128,256; RoPE base 500,000)."""

from __future__ import annotations

from unipar.models.llama import LlamaConfig


def llama3_8b(seq_len: int = 8192) -> LlamaConfig:
    """Llama 3 8B: 32 layers, 4,096 wide, FFN 14,336, 32 heads, 8 key/value heads."""
    return _llama3(seq_len, hidden=4096, layers=32, heads=32, ffn_hidden=14336)


def llama3_405b(seq_len: int = 8192) -> LlamaConfig:
    """Llama 3 405B: 126 layers, 16,384 wide, FFN 53,248, 128 heads, 8 key/value heads."""
    return _llama3(seq_len, hidden=16384, layers=126, heads=128, ffn_hidden=53248)


def _llama3(seq_len: int, *, hidden: int, layers: int, heads: int, ffn_hidden: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        seq_len=seq_len,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=8,
        ffn_hidden=ffn_hidden,
        rope_theta=500000.0,
    )
