"""Meta-device analysis: counts agree with closed forms; nothing is allocated."""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

from unipar.analysis import LayerKind, analyze
from unipar.models import GPTConfig, LlamaConfig, MLPConfig


def test_gpt_flops_and_params_match_megatron_formulas():
    h, layers, s, v, a = 1024, 4, 512, 8192, 16
    spec = GPTConfig(
        vocab_size=v, seq_len=s, hidden=h, layers=layers, heads=a, tie_embeddings=True
    ).spec()
    profile = analyze(spec.factory, spec.sample_shape, hidden=h)
    # Forward FLOPs per sample: 24 s l h^2 (1 + s/6h) for the blocks and 2 s h V for the
    # logits (Narayanan et al. 2021, Sec. 5.1; their V/16lh term counts the logits'
    # three passes inside a four-pass total).
    expected = 24 * s * layers * h * h * (1 + s / (6 * h)) + 2 * s * h * v
    assert profile.forward_flops == pytest.approx(expected, rel=1e-6)
    assert [layer.kind for layer in profile.layers].count(LayerKind.BLOCK) == layers
    assert profile.params == sum(p.numel() for p in spec.factory().parameters())
    block = profile.layers[2]
    assert block.output_elems == s * h


def test_repeated_blocks_cost_the_same_as_traced_ones():
    spec = GPTConfig(vocab_size=256, seq_len=64, hidden=64, layers=3, heads=4).spec()
    profile = analyze(spec.factory, spec.sample_shape, hidden=64)
    blocks = [layer for layer in profile.layers if layer.kind is LayerKind.BLOCK]
    assert blocks[0].forward_flops > 0
    assert all(
        (b.forward_flops, b.saved_elems_sharded, b.moved_elems_sharded, b.matmuls)
        == (
            blocks[0].forward_flops,
            blocks[0].saved_elems_sharded,
            blocks[0].moved_elems_sharded,
            blocks[0].matmuls,
        )
        for b in blocks
    )


def test_trillion_parameter_model_without_allocating():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = GPTConfig(
        vocab_size=51200, seq_len=2048, hidden=25600, layers=128, heads=160, tie_embeddings=True
    ).spec()
    profile = analyze(spec.factory, spec.sample_shape, hidden=25600)
    grown_gib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20
    assert profile.params > 1.0e12
    assert grown_gib < 2  # 1T fp32 parameters would be 4000 GB


@pytest.mark.parametrize("config", [LlamaConfig(), MLPConfig()], ids=["llama", "mlp"])
def test_other_reference_models(config):
    spec = config.spec()
    profile = analyze(
        spec.factory,
        spec.sample_shape,
        hidden=spec.hidden,
        input_dtype=torch.long if isinstance(config, LlamaConfig) else torch.float,
    )
    assert profile.num_blocks == 4
    assert profile.params == sum(p.numel() for p in spec.factory().parameters())
    assert all(layer.output_elems > 0 for layer in profile.layers)


def test_a_users_own_model():
    def factory():
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    profile = analyze(factory, (16,), input_dtype=torch.float)
    assert [layer.name for layer in profile.layers] == ["0", "1", "2"]
    assert profile.forward_flops == 2 * (16 * 64 + 64 * 4)


class _ResidualOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
            for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def test_repeated_blocks_with_the_residual_outside_cost_the_same():
    """A repeat is skipped and takes the first block's costs, even when the parent's
    forward runs an op under its name after it (``x = x + block(x)``)."""
    profile = analyze(_ResidualOutside, (8, 32), input_dtype=torch.float32, hidden=32)
    assert len(profile.layers) == 4
    first = profile.layers[0]
    assert first.forward_flops > 0
    for block in profile.layers[1:]:
        assert block.forward_flops == first.forward_flops
        assert block.memory_ops == first.memory_ops


def test_analysis_never_imports_the_compiler():
    """Planning from a cold process does not pay for torch._dynamo (about 1 s of CPU):
    a GPT analysed on meta in a fresh interpreter leaves it unimported. Fails if the
    elementwise ops' meta kernels bring it back. About 3 s."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from unipar.analysis import analyze\n"
        "from unipar.models import GPTConfig\n"
        "spec = GPTConfig(vocab_size=512, seq_len=64, hidden=64, layers=2, heads=4).spec()\n"
        "analyze(spec.factory, spec.sample_shape, hidden=64)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

