"""The callback each training actor runs after every boosting round."""

from __future__ import annotations

from typing import Any

import xgboost as xgb


class RoundCallback(xgb.callback.TrainingCallback):
    """Keeps the actor's checkpoint every ``every`` rounds, from the first round on
    (rounds 1, 1 + every, ...: XGBoost-Ray's schedule, so a restart redoes the rounds it
    did); with ``report``, also records each round's (global) metrics, and the model
    every ``report_models`` rounds."""

    def __init__(
        self, actor: Any, every: int, offset: int, report: bool, report_models: int
    ) -> None:
        self.actor, self.every, self.offset = actor, every, offset
        self.report, self.report_models = report, report_models

    def after_iteration(self, model: xgb.Booster, epoch: int, evals_log: Any) -> bool:
        done = self.offset + epoch + 1
        if (done - 1) % self.every == 0:
            self.actor.keep_checkpoint(done, model)
        if self.report:
            values = {
                f"{data}-{metric}": float(history[-1])
                for data, metrics in evals_log.items()
                for metric, history in metrics.items()
            }
            attach = self.report_models and done % self.report_models == 0
            self.actor.record_round(done, values, bytes(model.save_raw("ubj")) if attach else None)
        return self.actor.stop_requested.is_set()
