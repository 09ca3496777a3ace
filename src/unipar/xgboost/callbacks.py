"""Hooks that run inside every training actor (XGBoost-Ray's ``DistributedCallback``)."""

from __future__ import annotations

import os
from typing import Any


class DistributedCallback:
    """Override the hooks you need; each is called in the actor, in this order."""

    def on_init(self, actor: Any) -> None:
        """When the actor starts."""

    def before_data_loading(self, actor: Any, data: Any) -> None:
        """Before the actor reads its shard of ``data``."""

    def after_data_loading(self, actor: Any, data: Any) -> None:
        """After the actor built its DMatrix for ``data``."""

    def before_train(self, actor: Any) -> None:
        """Before each training attempt (again after a restart)."""

    def after_train(self, actor: Any, result: dict[str, Any]) -> None:
        """After training finished on this actor."""

    def before_predict(self, actor: Any) -> None:
        """Before the actor predicts on its shard."""

    def after_predict(self, actor: Any, predictions: Any) -> None:
        """After the actor predicted on its shard."""


class EnvironmentCallback(DistributedCallback):
    """Sets environment variables in every actor when it starts."""

    def __init__(self, env_dict: dict[str, str]) -> None:
        self.env_dict = dict(env_dict)

    def on_init(self, actor: Any, *args: Any, **kwargs: Any) -> None:
        os.environ.update(self.env_dict)
