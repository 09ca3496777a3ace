"""Report training to Ray Tune from inside a trial (XGBoost-Ray's ``tune`` names). Pass
one of these callbacks to :func:`unipar.xgboost.train` in a Tune trainable: every
round's evaluation metrics reach ``ray.tune.report`` from the trial's own process (the
actors record them, the driver passes them on), and ``TuneReportCheckpointCallback``
attaches the model every ``frequency`` rounds and at the end. Inside a trial, ``train``
also takes Ray's own ``ray.tune.integration.xgboost.TuneReportCheckpointCallback`` (it
is replaced by this one, with the same settings) and, given none, adds one that reports
every round and the final model (XGBoost-Ray's behaviour)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("unipar.xgboost")

Metrics = str | list[str] | dict[str, str] | None
CHECKPOINT_NAME = "model.ubj"


class TuneReportCallback:
    """Report metrics each round. ``metrics``: names to report (``"train-logloss"``, as
    ``{data}-{metric}``), or a mapping from the reported name to that; ``None``: all.
    ``results_postprocessing_fn``: applied to each round's dict before it is reported."""

    def __init__(
        self,
        metrics: Metrics = None,
        results_postprocessing_fn: Callable[[dict[str, float]], dict[str, float]] | None = None,
    ) -> None:
        self._metrics = [metrics] if isinstance(metrics, str) else metrics
        self._results_postprocessing_fn = results_postprocessing_fn
        self._filename = CHECKPOINT_NAME
        self._frequency = 0
        self._checkpoint_at_end = False

    @property
    def checkpoint_every(self) -> int:
        """Rounds between reported models (0: none during training)."""
        return self._frequency

    def select(self, values: dict[str, float]) -> dict[str, float]:
        if not self._metrics:
            chosen = dict(values)
        elif isinstance(self._metrics, dict):
            chosen = {name: values[source] for name, source in self._metrics.items()}
        else:
            chosen = {name: values[name] for name in self._metrics}
        if self._results_postprocessing_fn is not None:
            chosen = self._results_postprocessing_fn(chosen)
        return chosen

    def wants_model(self, rounds: int, last: bool) -> bool:
        every = self._frequency
        return (last and self._checkpoint_at_end) or bool(every and rounds % every == 0)

    def report(self, rounds: int, values: dict[str, float], model: bytes | None) -> None:
        from ray import tune  # noqa: PLC0415 (heavy: Ray Tune)

        metrics = {**self.select(values), "training_iteration": rounds}
        if model is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / self._filename).write_bytes(model)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))


class TuneReportCheckpointCallback(TuneReportCallback):
    """Report metrics each round, and the model (file ``filename``) every ``frequency``
    rounds (0: never during training) and, with ``checkpoint_at_end``, after the last
    round (Ray's ``TuneReportCheckpointCallback`` arguments)."""

    def __init__(
        self,
        metrics: Metrics = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, float]], dict[str, float]] | None = None,
    ) -> None:
        super().__init__(metrics, results_postprocessing_fn)
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end


def _try_add_tune_callback(kwargs: dict[str, Any]) -> bool:
    """Inside a Ray Tune trial: in ``kwargs["callbacks"]``, Ray's own xgboost Tune
    callbacks become ours (theirs would report from the actors, outside the trial), and
    one reporting every round and the final model is added when none is there. Returns
    whether this runs in a trial (XGBoost-Ray's helper, which ``train`` calls)."""
    if _trial_resources() is None:
        return False
    from ray.tune.integration.xgboost import (  # noqa: PLC0415 (heavy: Ray Tune)
        TuneReportCheckpointCallback as RayCallback,
    )

    callbacks = []
    for callback in kwargs.get("callbacks") or []:
        if isinstance(callback, RayCallback):
            log.warning(
                "replaced ray.tune.integration.xgboost.TuneReportCheckpointCallback with "
                "unipar.xgboost.tune.TuneReportCheckpointCallback (same settings), which "
                "reports from the trial's process; pass that one to avoid this warning"
            )
            callback = TuneReportCheckpointCallback(
                metrics=callback._metrics,
                filename=callback._filename,
                frequency=callback._frequency,
                checkpoint_at_end=callback._checkpoint_at_end,
                results_postprocessing_fn=callback._results_postprocessing_fn,
            )
        callbacks.append(callback)
    if not any(isinstance(c, TuneReportCallback) for c in callbacks):
        callbacks.append(TuneReportCheckpointCallback(frequency=0))
    kwargs["callbacks"] = callbacks
    return True


def _trial_resources() -> Any:
    """The resources of the Ray Tune trial this runs in, or None outside one. Asks Ray
    Train's context, as XGBoost-Ray did, then Ray Tune's: Ray Train's own (Ray >= 2.60
    with Train v2) raises in a Tune function and outside a training run."""
    import ray.train  # noqa: PLC0415 (heavy: Ray Train)

    try:
        return ray.train.get_context().get_trial_resources()
    except (RuntimeError, DeprecationWarning):
        import ray.tune  # noqa: PLC0415 (heavy: Ray Tune)

        with warnings.catch_warnings():  # outside a trial it warns, and returns None
            warnings.simplefilter("ignore")
            return ray.tune.get_context().get_trial_resources()


def load_model(checkpoint: Any, filename: str = CHECKPOINT_NAME) -> Any:
    """The booster of a checkpoint reported by :class:`TuneReportCheckpointCallback`."""
    import xgboost as xgb  # noqa: PLC0415 (heavy: xgboost)

    with checkpoint.as_directory() as directory:
        return xgb.Booster(model_file=str(Path(directory) / filename))
