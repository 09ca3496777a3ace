"""Report training to Ray Tune from inside a trial (XGBoost-Ray's ``unipar.xgboost.tune``
names). Pass one of these callbacks to :func:`unipar.xgboost.train` in a Tune trainable:
every round's evaluation metrics reach ``ray.tune.report`` from the trial's own process,
and ``TuneReportCheckpointCallback`` attaches the model every ``frequency`` rounds."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TuneReportCallback:
    """Report metrics each round. ``metrics``: names to report (``"train-logloss"``, as
    ``{data}-{metric}``), or a mapping from the reported name to that; ``None``: all."""

    metrics: Any = None

    checkpoint_every = 0

    def select(self, values: dict[str, float]) -> dict[str, float]:
        if self.metrics is None:
            return values
        if isinstance(self.metrics, dict):
            return {name: values[source] for name, source in self.metrics.items()}
        names = [self.metrics] if isinstance(self.metrics, str) else list(self.metrics)
        return {name: values[name] for name in names}

    def report(self, rounds: int, values: dict[str, float], model: bytes | None) -> None:
        from ray import tune  # noqa: PLC0415 (heavy: Ray Tune)

        metrics = {**self.select(values), "training_iteration": rounds}
        if model is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / "model.ubj").write_bytes(model)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))


@dataclass(frozen=True)
class TuneReportCheckpointCallback(TuneReportCallback):
    """Report metrics each round and the model (``model.ubj``) every ``frequency`` rounds
    and at the last round."""

    frequency: int = 5

    @property
    def checkpoint_every(self) -> int:  # type: ignore[override]
        return self.frequency


def load_model(checkpoint: Any) -> Any:
    """The booster of a checkpoint reported by :class:`TuneReportCheckpointCallback`."""
    import xgboost as xgb  # noqa: PLC0415 (heavy: xgboost)

    with checkpoint.as_directory() as directory:
        return xgb.Booster(model_file=str(Path(directory) / "model.ubj"))
