"""How a model takes a batch's inputs: a leaf, so that analysis, models, plan and
runtime share it without importing the job."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any


class ModelCall(Enum):
    """How the model takes a batch's inputs: ``model(inputs)`` (``POSITIONAL``), or
    ``model(**inputs)`` for a dict of named inputs (``KWARGS``, the Hugging Face
    convention: ``input_ids``, ``attention_mask``, ...)."""

    POSITIONAL = "positional"
    KWARGS = "kwargs"

    def __call__(self, model: Callable[..., Any], inputs: Any) -> Any:
        """``model`` applied to ``inputs`` this way."""
        return model(**inputs) if self is ModelCall.KWARGS else model(inputs)
