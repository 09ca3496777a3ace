"""The online gradient-noise estimate against a brute-force reference at fixed states.

Reference: per-sample gradients of every sample of a fixed population; batches drawn
from it with replacement have true gradient G = their mean and per-sample covariance Σ
(population), so B_simple = tr(Σ)/|G|² exactly. The online estimate sees only what the
trainer sees: squared norms of micro-batch gradients (real backward passes of the mean
loss) and of their mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from unipar.adapt.noise import NoiseEstimate, NoiseSample
from unipar.adapt.norms import squared_norm
from unipar.job import cross_entropy_loss
from unipar.models.gpt import GPT, GPTConfig


def _reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """B_simple = tr(Sigma)/|G|^2 from every sample's own gradient (one backward each)."""
    params = list(model.parameters())
    per = [
        torch.cat(
            [
                g.reshape(-1)
                for g in torch.autograd.grad(
                    cross_entropy_loss(model(x[i : i + 1]), y[i : i + 1]), params
                )
            ]
        ).double()
        for i in range(len(x))
    ]
    flat = torch.stack(per)
    mean = flat.mean(0)
    return float(((flat - mean) ** 2).sum(1).mean() / (mean**2).sum())


def _online(model, x, y, *, micro: int, count: int, steps: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    est = NoiseEstimate(smoothing=0.98)
    params = list(model.parameters())
    for _ in range(steps):
        grads = []
        for _ in range(count):
            idx = torch.as_tensor(rng.integers(0, len(x), micro))
            g = torch.autograd.grad(cross_entropy_loss(model(x[idx]), y[idx]), params)
            grads.append(g)
        small = np.mean([squared_norm(g) for g in grads])
        big = squared_norm([torch.stack(parts).mean(0) for parts in zip(*grads, strict=True)])
        est = est.update(NoiseSample(small, big, micro, count))
    return est.noise_scale


def _gpt_state(trained_steps: int):
    from unipar.data.text import ByteTextDataset, stdlib_corpus

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, seq_len=16, hidden=32, layers=2, heads=2)
    model = GPT(config)
    data = ByteTextDataset(stdlib_corpus(), config.seq_len)
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))[:96]
    x = torch.stack([data[int(i)][0] for i in pick])
    y = torch.stack([data[int(i)][1] for i in pick])
    _train(model, x, y, trained_steps, lr=3e-3)
    return model, x, y


def _digits_state(trained_steps: int):
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data[:400] / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target[:400])
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    _train(model, x, y, trained_steps, lr=1e-2)
    return model, x, y


def _train(model, x, y, steps, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (16,), generator=g)
        opt.zero_grad()
        cross_entropy_loss(model(x[idx]), y[idx]).backward()
        opt.step()


@pytest.mark.parametrize("state", [_gpt_state, _digits_state], ids=["gpt", "digits"])
@pytest.mark.parametrize("trained", [20])
def test_online_noise_scale_within_25_percent_of_per_sample_reference(state, trained):
    model, x, y = state(trained)
    reference = _reference(model, x, y)
    online = _online(model, x, y, micro=4, count=4, steps=150)
    assert abs(online / reference - 1) < 0.25, (online, reference)
