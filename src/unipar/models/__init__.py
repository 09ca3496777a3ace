"""Small reference models used by demos, tests and planning."""

from unipar.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
