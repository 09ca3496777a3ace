"""``train`` across Ray actors, with XGBoost-Ray's fault tolerance (``predict`` is in
:mod:`unipar.xgboost.prediction`; this module is XGBoost-Ray's ``main`` and names both).

Training uses xgboost's own collective: a ``RabitTracker`` on the driver, and a
``CommunicatorContext`` in each actor (a single actor trains alone, with neither;
elastic training that loses its only actor waits for the replacement). When an actor
dies its peers' collective calls fail at once; the driver then either replaces the
dead actor (``max_actor_restarts``), or goes on without it (``elastic_training``), and
resumes every live actor from the newest in-memory checkpoint, so the booster ends with
exactly ``num_boost_round`` trees.
An actor on a node that Ray drains (preemption notice, autoscaler scale-down) leaves
after the current round, with no round lost, and is replaced the same way. The actors'
processes, nodes and draining are followed by the gang supervisor that the torch
runtime uses too (:mod:`unipar.ray_cluster.supervisor`).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
from packaging.version import Version
from ray.exceptions import RayTaskError

from unipar.errors import ConfigError
from unipar.ray_cluster.supervisor import (
    PROCESS_LOST,
    Stream,
    Supervisor,
)
from unipar.xgboost.background_import import BackgroundImport
from unipar.xgboost.connect import attach_or_start_ray, run_on_this_node
from unipar.xgboost.exceptions import (
    RayXGBoostActorAvailable,
    RayXGBoostTrainingError,
    RayXGBoostTrainingStopped,
)
from unipar.xgboost.gang import (
    Gang,
    Losses,
    _RemoteRayXGBoostActor,
    admit_loaded,
    in_tune_trial,
    leave_draining,
    load_shards,
    newest_checkpoint,
    replace_actors,
    resolve_params,
    shutdown_actors,
    split_datasets,
    start_gang,
)
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams
from unipar.xgboost.prediction import predict
from unipar.xgboost.tune import TuneReportCallback, _try_add_tune_callback

if TYPE_CHECKING:
    import xgboost as xgb

log = logging.getLogger("unipar.xgboost")
XGBOOST_VERSION = Version(importlib.metadata.version("xgboost"))  # XGBoost-Ray's name
# Imported while the actors start (see background_import); needed from training on.
_XGBOOST = BackgroundImport("xgboost", "xgboost.tracker")

_DRAIN_CHECK_S = 1.0  # how often the driver asks Ray which nodes are draining

__all__ = [  # XGBoost-Ray's ``main`` module names
    "XGBOOST_VERSION",
    "RayDMatrix",
    "RayParams",
    "RayXGBoostActorAvailable",
    "RayXGBoostTrainingError",
    "RayXGBoostTrainingStopped",
    "_RemoteRayXGBoostActor",
    "_ray_get_actor_cpus",
    "_shutdown",
    "predict",
    "train",
]


def _say(ray_params: RayParams) -> Callable[..., None]:
    """XGBoost-Ray's ``verbose``: progress at INFO when verbose, else at DEBUG."""
    return log.info if ray_params.verbose else log.debug


def train(
    params: dict[str, Any],
    dtrain: RayDMatrix,
    num_boost_round: int = 10,
    *args: Any,
    evals: Any = (),
    evals_result: dict[str, Any] | None = None,
    additional_results: dict[str, Any] | None = None,
    ray_params: RayParams | dict[str, Any] | None = None,
    xgb_model: xgb.Booster | str | bytes | bytearray | None = None,
    callbacks: list[Any] | None = None,
    _remote: bool | None = None,
    **kwargs: Any,
) -> xgb.Booster:
    """Train a booster on ``dtrain`` across Ray actors; the same arguments as
    ``xgboost.train`` (``evals``, ``evals_result``, ``xgb_model``, ``callbacks``,
    ``early_stopping_rounds``, ``verbose_eval``, ``obj``, ``custom_metric``, ...) plus
    ``ray_params`` and ``additional_results`` (filled with ``total_n``,
    ``training_time_s``, ``total_time_s``, ``failures``, ``restarts``, ``num_actors`` and
    ``callback_returns``: per actor rank, what its callbacks ``put_queue``-d).
    ``feval`` (xgboost < 2's name) is taken as ``custom_metric``. ``_remote``: run this
    call's driver part in a Ray task on this node (default: when connected through Ray
    Client, as XGBoost-Ray). Inside a Ray Tune trial, metrics are reported to Tune (see
    :mod:`unipar.xgboost.tune`). Returns an ``xgboost.Booster``."""
    if args:
        raise ConfigError(
            "pass train's options by keyword (evals=..., ray_params=...), as xgboost.train "
            f"takes them; got {len(args)} extra positional arguments"
        )
    if not isinstance(dtrain, RayDMatrix):
        raise ConfigError(
            f"dtrain must be a unipar.xgboost.RayDMatrix, but got {type(dtrain).__name__}; "
            "wrap your data: RayDMatrix(data, label)"
        )
    if not dtrain.has_label:
        raise ConfigError(
            "training needs labels, but dtrain has none; pass label=... to RayDMatrix (an "
            "array with one value per row, or the name of a label column)"
        )
    if "feval" in kwargs:
        if kwargs.get("custom_metric") is not None:
            raise ConfigError("pass feval or custom_metric (its new name), not both")
        kwargs["custom_metric"] = kwargs.pop("feval")
    if kwargs:  # checked before any actor starts
        _check_keywords(kwargs)
    if str(params.get("tree_method", "")) == "exact":
        raise ConfigError(
            "tree_method='exact' does not train across actors (xgboost's exact method is "
            "single-process); use tree_method='hist' (the default) or 'approx'"
        )
    evals = (
        [evals]
        if isinstance(evals, tuple) and len(evals) == 2 and isinstance(evals[1], str)
        else list(evals)
    )
    for matrix, name in evals:
        if not isinstance(matrix, RayDMatrix):
            raise ConfigError(f"evals entry {name!r} must be a RayDMatrix")
    started = time.perf_counter()
    attach_or_start_ray(before_starting=_XGBOOST.start)
    in_trial = in_tune_trial()
    if _remote is None:
        _remote = ray.util.client.ray.is_connected() and not in_trial
    if _remote:
        return _train_in_a_task(
            params,
            dtrain,
            num_boost_round,
            evals=evals,
            evals_result=evals_result,
            additional_results=additional_results,
            ray_params=ray_params,
            xgb_model=xgb_model,
            callbacks=callbacks,
            **kwargs,
        )
    if in_trial:
        given = {"callbacks": callbacks}
        _try_add_tune_callback(given)
        callbacks = given["callbacks"]
    reporters = [c for c in callbacks or [] if isinstance(c, TuneReportCallback)]
    callbacks = [c for c in callbacks or [] if not isinstance(c, TuneReportCallback)]
    rp, planned, current = resolve_params(ray_params, params)
    rp.check_fault_tolerance()
    if rp.elastic_training and in_trial:
        raise ConfigError(
            "elastic_training cannot run inside a Ray Tune trial: the trial's result would "
            "depend on which actors were lost (their data sits out some rounds), so trials "
            "would not compare fairly; use max_actor_restarts (a replacement resumes from a "
            "checkpoint with all the data), or Tune's FailureConfig"
        )
    for matrix in [dtrain, *(m for m, _ in evals)]:
        matrix.assert_enough_shards_for_actors(rp.num_actors)
    params = dict(params)
    if "nthread" not in params and "n_jobs" not in params:
        params["nthread"] = int(rp.cpus_per_actor)
    if isinstance(xgb_model, (str, bytes, bytearray)):
        source = xgb_model if isinstance(xgb_model, str) else bytearray(xgb_model)
        xgb_model = _XGBOOST.result().Booster(model_file=source)
    outcome = _train(
        params,
        dtrain,
        num_boost_round,
        evals,
        rp,
        (planned, current),
        xgb_model,
        callbacks,
        kwargs,
        reporters,
    )
    booster = _XGBOOST.result().Booster(model_file=bytearray(outcome["model"]))
    booster.load_config(outcome["config"])
    total = time.perf_counter() - started
    _say(rp)(
        "[RayXGBoost] Finished XGBoost training on training data with total N=%d in %.2f "
        "seconds (%.2f pure XGBoost training time).",
        outcome["rows"],
        total,
        outcome["training_time_s"],
    )
    if evals_result is not None:
        evals_result.clear()
        evals_result.update(outcome["evals_result"])
    if additional_results is not None:
        additional_results.update(
            training_time_s=outcome["training_time_s"],
            total_time_s=total,
            total_n=outcome["rows"],
            failures=outcome["failures"],
            restarts=outcome["restarts"],
            num_actors=outcome["num_actors"],
            callback_returns=outcome["callback_returns"],
        )
    return booster


def _train_in_a_task(
    params: dict[str, Any],
    dtrain: RayDMatrix,
    num_boost_round: int,
    *,
    evals: list[tuple[RayDMatrix, str]],
    evals_result: dict[str, Any] | None,
    additional_results: dict[str, Any] | None,
    **kwargs: Any,
) -> xgb.Booster:
    """``train`` run by a Ray task on this node (XGBoost-Ray's ``_remote``); the matrices
    travel with their data, the results come back into the caller's dicts."""
    booster, result, extra = run_on_this_node(
        _train_returning_results,
        params,
        dtrain.carrying_data(),
        num_boost_round,
        evals=[(matrix.carrying_data(), name) for matrix, name in evals],
        **kwargs,
    )
    if evals_result is not None:
        evals_result.clear()
        evals_result.update(result)
    if additional_results is not None:
        additional_results.update(extra)
    return booster


def _train_returning_results(*args: Any, **kwargs: Any) -> tuple[Any, dict, dict]:
    result: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    booster = train(*args, evals_result=result, additional_results=extra, _remote=False, **kwargs)
    return booster, result, extra


def _ray_get_actor_cpus() -> float:
    """The CPUs Ray gave the calling actor or task (XGBoost-Ray's helper)."""
    assigned = ray.get_runtime_context().get_assigned_resources()
    return next((amount for name, amount in assigned.items() if name.startswith("CPU")), 1)


def _check_keywords(kwargs: dict[str, Any]) -> None:
    """Keywords ``xgboost.train`` does not take fail here, before any actor starts."""
    known = set(inspect.signature(_XGBOOST.result().train).parameters)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"train() got keyword arguments that xgboost.train does not take: {unknown}; "
            f"it takes {sorted(known)}"
        )


@dataclass
class _Queue:
    """What the actors' callbacks ``put_queue``-d: callables run here, on the driver;
    anything else is kept per actor rank (``callback_returns``)."""

    returns: list[list[Any]]

    def take(self, items: list[tuple[int, Any]]) -> None:
        for rank, item in items:
            if callable(item):
                item()
            else:
                self.returns[rank].append(item)


def _actor_failure(results: dict[int, Any]) -> RayXGBoostTrainingError:
    """The error of the actor where training failed first: one that raised something
    else than a collective error (its peers then fail in the collective)."""
    failed = {i: r for i, r in results.items() if "error" in r}
    rank = next((i for i, r in failed.items() if not r["collective"]), min(failed))
    result = failed[rank]
    return RayXGBoostTrainingError(
        f"training failed on actor {rank} (pid {result['pid']}): {result['error']}\n"
        f"--- traceback of actor {rank} ---\n{result['traceback']}",
        actor_rank=rank,
        remote_traceback=result["traceback"],
    )


def _train(
    params, dtrain, rounds, evals, rp, placement, xgb_model, callbacks, kwargs, reporters
) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    n = rp.num_actors
    say = _say(rp)
    split_datasets([dtrain, *[m for m, _ in evals]], n)
    split: dict[str, Any] = {}

    def shard_data(actors: list[Any]) -> None:
        # While the actors start: import xgboost here (it competes less with their start
        # once they are requested) and put in-memory data in the object store.
        _XGBOOST.start()
        split["train"] = dtrain.shards(n, actors)
        split["evals"] = [(m, name, m.shards(n, actors)) for m, name in evals]

    gang = start_gang(rp, *placement, meanwhile=shard_data, shutdown=_shutdown)
    say(
        "[RayXGBoost] Created %d new actors (%d total actors). Waiting until actors are "
        "ready for training.",
        n,
        n,
    )
    queue = _Queue([[] for _ in range(n)])
    try:
        shards, eval_shards = split["train"], split["evals"]

        def load_refs(index: int, actor: Any) -> list[Any]:
            refs = [actor.load.remote("train", dtrain, shards[index])]
            refs += [actor.load.remote(name, m, s[index]) for m, name, s in eval_shards]
            return refs

        losses = Losses()
        load_shards(gang, sorted(gang.members), load_refs, losses)
        start: tuple[int, bytes] | None = None
        if xgb_model is not None:
            start = (xgb_model.num_boosted_rounds(), bytes(xgb_model.save_raw("ubj")))
        base_rounds = start[0] if start else 0
        target = base_rounds + rounds
        relay = _TuneRelay(reporters, target) if reporters else None
        history: dict[str, Any] = {}
        training_started = time.perf_counter()
        say("[RayXGBoost] Starting XGBoost training.")
        while True:
            live = dict(gang.actors)
            tracker = _collective_tracker(len(live))
            done_rounds = start[0] if start else 0
            refs = {
                i: actor.train.remote(
                    tracker.worker_args() if tracker is not None else None,
                    params,
                    target - done_rounds,
                    evals=[name for _, name in evals],
                    start=start,
                    checkpoint_frequency=rp.checkpoint_frequency,
                    callbacks=callbacks,
                    kwargs=kwargs,
                    report=relay is not None,
                    report_models=max((r.checkpoint_every for r in reporters), default=0),
                )
                for i, actor in live.items()
            }
            results, dead = _wait(refs, gang, queue, relay)
            # Actors whose user code called sys.exit(): lost for this attempt, as a dead
            # one is, but their process and data stay and train again from the restart.
            exited = sorted(i for i, r in results.items() if r.get("exited"))
            leaving = sorted(gang.leaving - set(dead))
            gang.leaving.clear()
            if leaving:  # they stopped after a round; their node goes away
                Supervisor.kill([gang.members.pop(index) for index in leaving])
            failed = any("error" in r for r in results.values())
            try:
                if tracker is not None:
                    tracker.free()
            except _XGBOOST.result().core.XGBoostError:
                # it fails on its own when a worker vanished or raised mid-round: the
                # worker's error is the one to report
                if not dead and not exited and not failed:
                    raise
            if not dead and not exited and failed:
                raise _actor_failure(results)
            if not dead and not exited:
                final = next(r for r in results.values() if r["model"] is not None)
                # Stopped before the last round on the driver's request: replacements
                # join, drained actors leave, and training goes on. Stopped by the job's
                # own callbacks (early stopping): that is the result.
                paused = final["rounds"] < target and any(
                    r["asked_to_stop"] for r in results.values()
                )
                if relay is not None and not paused:
                    relay.finish(final["rounds"], final["evals_result"], final["model"])
                if paused:
                    start = (final["rounds"], final["model"])
                    _merge(history, final["evals_result"], done_rounds - base_rounds)
                    if leaving:
                        log.warning(
                            "actors %s leave draining nodes after round %d", leaving, start[0]
                        )
                        replace_actors(gang, leaving, rp, load_refs, losses)
                    continue
                _merge(history, final["evals_result"], done_rounds - base_rounds)
                return {
                    "model": final["model"],
                    "config": final["config"],
                    "evals_result": history,
                    "rows": sum(gang.rows[i] for i in live),
                    "failures": losses.failures,
                    "restarts": losses.restarts,
                    "num_actors": len(live),
                    "training_time_s": time.perf_counter() - training_started,
                    "callback_returns": queue.returns,
                }
            for index in dead:
                gang.members.pop(index, None)
            start = newest_checkpoint(gang, start)
            losses.count(dead + exited, rp, "in training")
            replace_actors(gang, dead + leaving, rp, load_refs, losses)
            if rp.elastic_training:
                log.warning("lost actors %s; continuing on %d", dead, len(gang.members))
            else:
                log.warning(
                    "replaced actors %s (and restarted %s, which exited); resuming from "
                    "round %d",
                    dead,
                    exited,
                    start[0] if start else 0,
                )
    finally:
        gang.stop()


def _shutdown(
    actors: list[Any], pending_actors: dict[int, Any] | None = None, placement_group: Any = None
) -> None:
    """XGBoost-Ray's hook at the end of ``train`` and ``predict``: stops the actors (by
    rank, None where one was lost), the replacements still loading, and removes the
    placement group the call made."""
    shutdown_actors(actors, pending_actors, placement_group)


@dataclass
class _TuneRelay:
    """Passes finished rounds from the actors to Ray Tune, each round once; the last
    round waits for the final model."""

    reporters: list[Any]
    target: int
    reported: int = 0

    def pass_on(self, rounds: list[tuple[int, dict[str, float], Any]]) -> None:
        for done, values, model in rounds:
            if self.reported < done < self.target:
                for reporter in self.reporters:
                    reporter.report(done, values, model)
                self.reported = done

    def finish(self, rounds: int, evals_result: dict[str, Any], model: bytes) -> None:
        values = {f"{d}-{m}": v[-1] for d, ms in evals_result.items() for m, v in ms.items()}
        for reporter in self.reporters:
            wants_model = reporter.wants_model(rounds, last=True)
            if rounds > self.reported or wants_model:  # an early stop at a passed round
                reporter.report(rounds, values, model if wants_model else None)
        self.reported = rounds


def _collective_tracker(actors: int) -> Any:
    """A started tracker of xgboost's collective for ``actors`` peers; None for one
    actor, which trains alone (no communicator: about 2% of a 1M-row run saved, and the
    driver needs xgboost only for the returned booster)."""
    if actors == 1:
        return None
    tracker = _XGBOOST.result().tracker.RabitTracker(
        n_workers=actors, host_ip=ray.util.get_node_ip_address()
    )
    tracker.start()
    return tracker


def _drain(actors: dict[int, Any], queue: _Queue, relay: _TuneRelay | None) -> None:
    """Take what the actors recorded: their ``put_queue`` items, and (from the first
    actor: all log the same global metrics) the rounds for Tune."""
    refs = {i: actor.drain.remote() for i, actor in actors.items()}
    for i, ref in refs.items():
        try:
            rounds, items = ray.get(ref, timeout=10)
        except Exception:  # that actor died: its failure is handled by the caller
            continue
        queue.take(items)
        if relay is not None and i == min(refs):
            relay.pass_on(rounds)


def _wait(
    refs: dict[int, Any], gang: Gang, queue: _Queue, relay: _TuneRelay | None = None
) -> tuple[dict[int, Any], list[int]]:
    """Results by shard, and the shards whose actor's process is gone. While training
    runs, takes back replacements whose data finished loading (elastic training), asks
    everyone to stop after the round when an actor's node is draining, and every 0.5 s
    drains the actors' queues. Returns early when an actor raised (not a collective
    error, not sys.exit()): its peers may wait for it in the collective (an actor that
    exits leaves the collective, and its peers' calls fail at once)."""
    streams = {i: Stream(gang.members[i], ref) for i, ref in refs.items()}
    results: dict[int, Any] = {}
    dead: list[int] = []
    next_drain_check = time.monotonic()
    while running := [s for s in streams.values() if not s.done]:
        ray.wait([s.handle for s in running], num_returns=1, timeout=0.5)
        for i, stream in streams.items():
            if stream.done:
                continue
            try:
                stream.take_ready(is_last=lambda _: True)
            except PROCESS_LOST:
                stream.done = True
                dead.append(i)
                continue
            except RayTaskError as error:
                raise RayXGBoostTrainingError(
                    f"training failed on actor {i}: {error}", actor_rank=i
                ) from error
            if stream.done:
                results[i] = stream.result
        if any("error" in r and not r["collective"] and not r["exited"] for r in results.values()):
            break
        admit_loaded(gang)
        if time.monotonic() >= next_drain_check and not dead:
            next_drain_check = time.monotonic() + _DRAIN_CHECK_S
            leave_draining(gang, [streams[i].member for i in streams if i not in results])
        live = {i: gang.members[i].actor for i in refs if i not in dead and i in gang.members}
        _drain(live, queue, relay)
    return results, dead


def _merge(history: dict[str, Any], log: dict[str, Any], offset: int) -> None:
    """Evaluation results of an attempt that started after ``offset`` rounds."""
    for data_name, metrics in log.items():
        target = history.setdefault(data_name, {})
        for metric, values in metrics.items():
            target[metric] = list(target.get(metric, []))[:offset] + list(values)
