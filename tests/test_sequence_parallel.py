"""Sequence parallelism turns each tensor-parallel block's norms sequence-parallel, its
column-wise layers gathering the sequence and its row-wise layers scattering it, and
leaves the layers between blocks as plain tp. No Ray (parity: test_parity_plans,
``*-sequence-parallel``)."""

from __future__ import annotations

from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from unipar.models.gpt import GPT, GPTConfig
from unipar.runtime.parallel.sequence import sequence_parallel_styles

CONFIG = GPTConfig(vocab_size=64, seq_len=16, hidden=32, layers=2, heads=2)


def test_block_norms_shard_the_sequence_and_the_rest_stays_plain_tp():
    model = GPT(CONFIG)
    styles = {"tok_embeddings": RowwiseParallel(), "output": ColwiseParallel()}
    for i in range(CONFIG.layers):
        styles |= {f"layers.{i}.attention.{n}": ColwiseParallel() for n in ("wq", "wk", "wv")}
        styles |= {f"layers.{i}.attention.wo": RowwiseParallel()}
        styles |= {
            f"layers.{i}.mlp.fc": ColwiseParallel(),
            f"layers.{i}.mlp.proj": RowwiseParallel(),
        }
    result = sequence_parallel_styles(model, styles)
    for i in range(CONFIG.layers):
        for norm in ("attention_norm", "mlp_norm", "dropout"):
            assert isinstance(result[f"layers.{i}.{norm}"], SequenceParallel)
        assert result[f"layers.{i}.attention.wq"].input_layouts == (Shard(1),)
        assert result[f"layers.{i}.mlp.proj"].output_layouts == (Shard(1),)
        assert type(result[f"layers.{i}"]).__name__ == "BlockLayouts"
    assert "norm" not in result and result["output"] is styles["output"]
    assert result["tok_embeddings"] is styles["tok_embeddings"]
