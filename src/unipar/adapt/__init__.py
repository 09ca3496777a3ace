"""Adaptive batch size and learning rate (pure: numbers in, decisions out; no Ray)."""

from unipar.adapt.config import AdaptiveBatch, LRRule

__all__ = ["AdaptiveBatch", "LRRule"]
