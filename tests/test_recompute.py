"""Activation recompute keeps fewer activations: selective keeps the matrix
multiplications' outputs only, full keeps each block's input only, and recompute of
every n-th block wraps that share of blocks. No Ray: the same wrappers run on workers
(parity in test_parity_plans)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from unipar.models.gpt import GPT, GPTConfig
from unipar.plan import Plan, Recompute
from unipar.runtime.parallel.recompute import apply_recompute

CONFIG = GPTConfig(vocab_size=64, seq_len=16, hidden=32, layers=4, heads=2)


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _backward_ops(plan: Plan) -> tuple[int, Counter[str]]:
    """(wrapped blocks, the operations backward runs) under ``plan``."""
    torch.manual_seed(0)
    model = apply_recompute(GPT(CONFIG), plan)
    wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    tokens = torch.randint(0, CONFIG.vocab_size, (4, CONFIG.seq_len))
    loss = model(tokens).sum()
    with _CountOps() as counter:
        loss.backward()
    return wrapped, counter.ops


def test_selective_recomputes_all_but_the_matrix_multiplications():
    none = _backward_ops(Plan())
    selective = _backward_ops(Plan(recompute=Recompute.SELECTIVE))
    full = _backward_ops(Plan(recompute=Recompute.FULL))
    every_2nd = _backward_ops(Plan(recompute=Recompute.FULL, recompute_every=2))
    assert (none[0], selective[0], full[0], every_2nd[0]) == (0, 4, 4, 2)
    # linear layers' forward (addmm) runs again only under full recompute, twice as
    # often when every block recomputes as when every 2nd does
    assert none[1]["addmm"] == selective[1]["addmm"] == 0
    assert full[1]["addmm"] == 2 * every_2nd[1]["addmm"] > 0
    # the attention core and element-wise ops run again under selective recompute
    attention = "_scaled_dot_product_flash_attention_for_cpu"  # the CPU kernel's forward
    assert none[1][attention] == 0 < selective[1][attention] == full[1][attention] == 4
    assert none[1]["gelu"] == 0 < selective[1]["gelu"] == full[1]["gelu"] == 4
    assert sum(none[1].values()) < sum(selective[1].values()) < sum(full[1].values())


def test_selective_op_recomputes_every_second_product_and_no_attention():
    """torchtitan's op-level policy: of each block's products the 2nd, 4th, ... run
    again in backward, the attention kernel does not, element-wise ops do."""
    none = _backward_ops(Plan())
    op_level = _backward_ops(Plan(recompute=Recompute.SELECTIVE_OP))
    full = _backward_ops(Plan(recompute=Recompute.FULL))
    assert op_level[0] == 4
    attention = "_scaled_dot_product_flash_attention_for_cpu"
    assert op_level[1][attention] == none[1][attention] == 0 < full[1][attention]
    assert op_level[1]["gelu"] == full[1]["gelu"] == 4
    # a GPT block runs 4 linear layers (qkv, out, fc, proj): 2 of them run again
    products = op_level[1]["addmm"] + op_level[1]["mm"] - none[1]["addmm"] - none[1]["mm"]
    assert products == 4 * 2


def test_selective_op_gives_the_same_gradients_as_no_recompute():
    grads = []
    for recompute in (Recompute.NONE, Recompute.SELECTIVE_OP):
        torch.manual_seed(0)
        model = apply_recompute(GPT(CONFIG), Plan(recompute=recompute))
        tokens = torch.randint(0, CONFIG.vocab_size, (4, CONFIG.seq_len))
        model(tokens).float().pow(2).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
