"""Optuna driven by unipar: its sampler through ask/tell, its pruner on every report.

Tune's ``OptunaSearch`` never calls the study's pruner. Here one study is shared by a Tune
``Searcher`` (``suggest`` asks, ``on_trial_complete`` tells, ``save``/``restore`` keep the
study for a resumed experiment) and a Tune ``Stopper`` (each result goes to
``trial.report(value, step)``; ``trial.should_prune()`` stops the trial, which is then told
as pruned). Sampling and pruning stay Optuna's (Akiba et al.
2019, "Optuna: A Next-generation Hyperparameter Optimization Framework").
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ray.tune import Stopper
from ray.tune.search import Searcher

from unipar.errors import ConfigError
from unipar.tuning.backends import from_optuna, optuna_distribution
from unipar.tuning.space import ParamKind, SearchSpace


def _optuna() -> Any:
    try:
        import optuna  # noqa: PLC0415 (optional: optuna)
    except ImportError:
        raise ConfigError(
            "the optuna searcher needs optuna, which is not installed; "
            "`pip install unipar[tune]` (or `pip install optuna`)"
        ) from None
    return optuna


def optuna_distributions(space: SearchSpace) -> dict[str, Any]:
    """Optuna's distribution of each parameter that is not a constant."""
    _optuna()
    return {
        p.name: optuna_distribution(p) for p in space.params if p.kind is not ParamKind.CONSTANT
    }


class OptunaDriver:
    """One Optuna study and the trials in flight (Tune trial id -> Optuna trial)."""

    def __init__(
        self, space: SearchSpace, *, metric: str, mode: str, seed: int | None, pruner: Any
    ) -> None:
        optuna = _optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.metric, self.mode = metric, mode
        self.params = {p.name: p for p in space.params if p.kind is not ParamKind.CONSTANT}
        self.distributions = optuna_distributions(space)
        self.constants = space.constants()
        self.study = optuna.create_study(
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
            direction="minimize" if mode == "min" else "maximize",
        )
        self.live: dict[str, Any] = {}
        self.pruned: set[str] = set()

    def ask(self, trial_id: str) -> dict[str, Any]:
        trial = self.study.ask(self.distributions)
        self.live[trial_id] = trial
        sampled = {n: from_optuna(self.params[n], v) for n, v in trial.params.items()}
        return {**self.constants, **sampled}

    def report(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Pass one result to the pruner; True when Optuna prunes the trial."""
        trial = self.live.get(trial_id)
        if trial is None or self.metric not in result:
            return False
        trial.report(float(result[self.metric]), step=int(result.get("step", 0)))
        if trial.should_prune():
            self.pruned.add(trial_id)
            return True
        return False

    def tell(self, trial_id: str, result: dict[str, Any] | None, error: bool) -> None:
        optuna = _optuna()
        trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        state = optuna.trial.TrialState
        if trial_id in self.pruned:
            self.study.tell(trial, state=state.PRUNED)
        elif error or not result or self.metric not in result:
            self.study.tell(trial, state=state.FAIL)
        else:
            self.study.tell(trial, float(result[self.metric]))


class OptunaSearcher(Searcher):
    """Tune's searcher side of :class:`OptunaDriver`."""

    def __init__(self, driver: OptunaDriver) -> None:
        super().__init__(metric=driver.metric, mode=driver.mode)
        self.driver = driver

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        return self.driver.ask(trial_id)

    def save(self, checkpoint_path: str) -> None:
        """The study and the trials in flight, for ``resume`` (Tune calls this)."""
        state = (self.driver.study, self.driver.live, self.driver.pruned)
        Path(checkpoint_path).write_bytes(pickle.dumps(state))

    def restore(self, checkpoint_path: str) -> None:
        """Back to a saved study: a resumed trial is told to the Optuna trial it was."""
        state = pickle.loads(Path(checkpoint_path).read_bytes())
        self.driver.study, self.driver.live, self.driver.pruned = state

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self.driver.tell(trial_id, result, error)


class OptunaPruning(Stopper):
    """Tune's stopper side of :class:`OptunaDriver`: stops what the pruner prunes."""

    def __init__(self, driver: OptunaDriver) -> None:
        self.driver = driver

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.driver.report(trial_id, result)

    def stop_all(self) -> bool:
        return False
