"""Tiny random-initialised Hugging Face models for tests, built from config objects
(nothing is downloaded), and jobs training them on random tokens."""

from __future__ import annotations

import functools
import os

import torch
from torch import nn
from torch.nn import functional as F

from unipar.job import Job, OptimizerSpec, cross_entropy_loss
from unipar.testing import RandomTokens

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, SEQ = 128, 16


# The tiny size every Llama-family test model shares (no dropout, no cache).
TINY_DECODER = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
    "use_cache": False,
    "attention_dropout": 0.0,
}


def llama():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY_DECODER)
    return LlamaForCausalLM(config)


def qwen2():  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**TINY_DECODER, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def gpt2():  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=32,
        n_layer=4,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def mistral():  # type: ignore[no-untyped-def]
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**TINY_DECODER)
    return MistralForCausalLM(config)


class UserModelAroundGPT2(nn.Module):
    """A user's own module holding a Hugging Face model, calling it by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = gpt2()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt(input_ids=tokens).logits


def logits_loss(output, targets):  # type: ignore[no-untyped-def]
    """A user's loss that reads ``.logits`` (the model's ``ModelOutput`` under every plan,
    pipeline parallel included)."""
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


FAMILIES = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2}  # trained in the parity tests
CHECKED_ONLY = {
    "mistral": mistral,
    "gpt2-in-user-model": UserModelAroundGPT2,
}  # its stages and tensor-parallel roles checked
# a family trained with the user's own loss instead of unipar's default one
LOSSES = {"llama": logits_loss}


def hf_job(family: str, *, steps: int = 3, global_batch_size: int = 8) -> Job:
    return Job(
        name=f"hf-{family}",
        model=(FAMILIES | CHECKED_ONLY)[family],
        dataset=functools.partial(RandomTokens, 64, SEQ, VOCAB),
        global_batch_size=global_batch_size,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
        loss=LOSSES.get(family, cross_entropy_loss),
    )
