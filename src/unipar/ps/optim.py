"""The optimizer a server runs on its shard, from the job's one
:class:`~unipar.optimizer.OptimizerSpec`: dense tensors updated whole, embedding rows
updated only where pushed (the sparse update: lazily, as ``torch.optim.SparseAdam``, for
Adam and AdamW). Pure torch.

Formulas as in the PyTorch docs of ``torch.optim.SGD`` (no momentum), ``Adagrad``
(``lr_decay=0``, ``initial_accumulator_value=0``) and ``Adam``/``SparseAdam``
(Kingma & Ba 2015, bias-corrected; AdamW without weight decay is Adam), so a
synchronous run matches one process using those optimizers.
"""

from __future__ import annotations

import math

import torch

from unipar.errors import ConfigError
from unipar.optimizer import OptimizerKind, OptimizerSpec


def server_rule(spec: OptimizerSpec) -> str | None:
    """Why the servers cannot run ``spec`` (None: they can). They run SGD without
    momentum, Adagrad, and Adam or AdamW, all without weight decay."""
    if spec.weight_decay or (spec.kind is OptimizerKind.SGD and spec.momentum):
        return (
            f"servers run SGD without momentum, or Adagrad, Adam or AdamW without weight "
            f"decay, but got "
            f"{spec.kind.value} with momentum={spec.momentum}, weight_decay={spec.weight_decay}"
        )
    return None


class ShardOptimizer:
    """Optimizer state for the tensors of one server (sharded: each server keeps the
    state of only what it holds)."""

    def __init__(self, spec: OptimizerSpec, tensors: dict[str, torch.Tensor]) -> None:
        rule = server_rule(spec)
        if rule is not None:
            raise ConfigError(f"{rule}; pass weight_decay=0 and momentum=0")
        self.spec = spec
        self.state: dict[str, dict[str, torch.Tensor]] = {}
        self.steps: dict[str, int] = dict.fromkeys(tensors, 0)
        for name, t in tensors.items():
            if spec.kind is OptimizerKind.ADAGRAD:
                self.state[name] = {"sum": torch.zeros_like(t)}
            elif spec.kind in (OptimizerKind.ADAM, OptimizerKind.ADAMW):
                self.state[name] = {"m": torch.zeros_like(t), "v": torch.zeros_like(t)}
            else:
                self.state[name] = {}

    def step(
        self, name: str, param: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor | None
    ) -> None:
        """Apply ``grad`` to ``param`` (all of it, or the local ``rows`` given)."""
        self.steps[name] += 1
        spec, state = self.spec, self.state[name]
        index = slice(None) if rows is None else rows
        p = param[index]
        if spec.kind is OptimizerKind.SGD:
            param[index] = p - spec.lr * grad
        elif spec.kind is OptimizerKind.ADAGRAD:
            acc = state["sum"][index] + grad * grad
            state["sum"][index] = acc
            param[index] = p - spec.lr * grad / (acc.sqrt() + spec.epsilon)
        else:
            b1, b2 = spec.betas
            t = self.steps[name]
            m = state["m"][index] * b1 + (1 - b1) * grad
            v = state["v"][index] * b2 + (1 - b2) * grad * grad
            state["m"][index], state["v"][index] = m, v
            if rows is None:  # torch.optim.Adam
                denom = v.sqrt() / math.sqrt(1 - b2**t) + spec.epsilon
                param[index] = p - (spec.lr / (1 - b1**t)) * m / denom
            else:  # torch.optim.SparseAdam: eps added before the bias correction
                size = spec.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                param[index] = p - size * m / (v.sqrt() + spec.epsilon)

    def state_dict(self) -> dict:
        return {"state": self.state, "steps": self.steps}

    def load_state_dict(self, saved: dict) -> None:
        self.state, self.steps = saved["state"], saved["steps"]
