"""Reference models used by demos, tests and planning: GPT, Llama-style, MLP."""

from unipar.models.gpt import GPT, GPTConfig
from unipar.models.llama import Llama, LlamaConfig
from unipar.models.llama_presets import llama3_8b, llama3_405b
from unipar.models.mlp import MLP, MLPConfig
from unipar.models.spec import ModelSpec

__all__ = [
    "GPT",
    "MLP",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "MLPConfig",
    "ModelSpec",
    "llama3_8b",
    "llama3_405b",
]
