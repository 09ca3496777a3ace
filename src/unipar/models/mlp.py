"""A multi-layer perceptron of residual GELU blocks, for tabular or feature inputs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from unipar import checks
from unipar.models.spec import ModelSpec


@dataclass(frozen=True)
class MLPConfig:
    in_features: int = 32
    hidden: int = 256
    layers: int = 4
    out_features: int = 10
    expansion: int = 4

    def __post_init__(self) -> None:
        names = ("in_features", "hidden", "layers", "out_features", "expansion")
        checks.positive_ints("MLPConfig", ((n, getattr(self, n)) for n in names))

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name="mlp",
            factory=functools.partial(MLP, self),
            sample_shape=(self.in_features,),
            input_dtype=torch.float32,
            hidden=self.hidden,
            tp_divisibility=(("expansion * hidden", self.expansion * self.hidden),),
        )


class MLPBlock(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden)
        self.fc = nn.Linear(config.hidden, config.expansion * config.hidden)
        self.proj = nn.Linear(config.expansion * config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(F.gelu(self.fc(self.norm(x))))


class MLP(nn.Module):
    """Features [batch, in_features] -> outputs [batch, out_features]."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.input = nn.Linear(config.in_features, config.hidden)
        self.layers = nn.ModuleDict({str(i): MLPBlock(config) for i in range(config.layers)})
        self.output = nn.Linear(config.hidden, config.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input(x) if self.input is not None else x
        for block in self.layers.values():
            h = block(h)
        return self.output(h) if self.output is not None else h
