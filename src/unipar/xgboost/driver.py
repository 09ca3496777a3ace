"""``train`` and ``predict`` across Ray actors, with XGBoost-Ray's fault tolerance.

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
runtime uses too (:mod:`unipar.runtime.gang`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import get_current_placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from unipar.errors import ConfigError
from unipar.ray_session import require_resources, reserve_bundles
from unipar.runtime.gang import (
    PROCESS_LOST,
    Member,
    Stream,
    Supervisor,
    describe_all,
    on_draining_nodes,
)
from unipar.xgboost.actor import XGBoostActor
from unipar.xgboost.background_import import BackgroundImport
from unipar.xgboost.connect import attach_or_start_ray
from unipar.xgboost.exceptions import (
    RayXGBoostActorAvailable,
    RayXGBoostTrainingError,
    RayXGBoostTrainingStopped,
)
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams
from unipar.xgboost.resources import ActorResources, plan_actors, plan_in_bundles

if TYPE_CHECKING:
    import xgboost as xgb

log = logging.getLogger("unipar.xgboost")
# Imported while the actors start (see background_import); needed from training on.
_XGBOOST = BackgroundImport("xgboost", "xgboost.tracker")

_START_TIMEOUT_S = 300.0  # an actor's constructor (placement already reserved)
_DRAIN_CHECK_S = 1.0  # how often the driver asks Ray which nodes are draining

__all__ = [  # XGBoost-Ray's ``main`` module names
    "RayParams",
    "RayXGBoostActorAvailable",
    "RayXGBoostTrainingError",
    "RayXGBoostTrainingStopped",
    "predict",
    "train",
]


@dataclass
class _Gang:
    """The live actors, by data shard index, in their placement group: their own, or the
    caller's (a Ray Tune trial laid out by ``RayParams.get_tune_resources``), whose first
    bundle is the caller's."""

    params: RayParams
    placement: Any
    owned: bool
    first_bundle: int = 0
    members: dict[int, Member] = field(default_factory=dict)
    pending: dict[int, Any] = field(default_factory=dict)  # replacements still loading
    loading: dict[int, list[Any]] = field(default_factory=dict)  # their load refs
    leaving: set[int] = field(default_factory=set)  # on draining nodes: go after this round

    @property
    def actors(self) -> dict[int, Any]:
        return {shard: member.actor for shard, member in self.members.items()}

    def start(
        self, shards: list[int], meanwhile: Callable[[list[Any]], None] | None = None
    ) -> None:
        """Start an actor for each of ``shards`` and wait for its constructor; while they
        start, ``meanwhile(actors)`` runs here."""
        actors = [self.spawn(shard) for shard in shards]
        if meanwhile is not None:
            try:
                meanwhile(actors)
            except BaseException:
                self._kill(actors)
                raise
        for shard, member in zip(shards, describe_all(actors, _START_TIMEOUT_S), strict=True):
            if member is None:
                self._kill(actors)
                raise RayXGBoostTrainingError(
                    f"the actor for data shard {shard} did not start within "
                    f"{_START_TIMEOUT_S:.0f} s; see its log (ray logs) for the error",
                    actor_rank=shard,
                )
            self.members[shard] = member

    @staticmethod
    def _kill(actors: list[Any]) -> None:
        for actor in actors:
            ray.kill(actor, no_restart=True)

    def admit(self, shard: int) -> bool:
        """A replacement whose data is loaded becomes a member, unless its node is
        draining (it waits: its node goes away, or the drain is cancelled). One that died
        while loading is dropped (training goes on without it). Whether it joined."""
        actor = self.pending[shard]
        try:
            ray.get(self.loading[shard])
            member = Member(actor, *ray.get(actor.describe.remote()))
        except (*PROCESS_LOST, RayTaskError) as error:
            log.warning("replacement for shard %d lost while loading: %s", shard, error)
            ray.kill(actor, no_restart=True)
            del self.pending[shard], self.loading[shard]
            return False
        if on_draining_nodes([member]):
            return False
        del self.pending[shard], self.loading[shard]
        self.members[shard] = member
        return True

    def spawn(self, shard: int) -> Any:
        options: dict[str, Any] = {
            "num_cpus": self.params.cpus_per_actor,
            "num_gpus": self.params.gpus_per_actor,
            "max_concurrency": 2,
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=shard + self.first_bundle
            ),
        }
        if self.params.resources_per_actor:
            options["resources"] = dict(self.params.resources_per_actor)
        return (
            ray.remote(XGBoostActor)
            .options(**options)
            .remote(shard, list(self.params.distributed_callbacks or []))
        )

    def stop(self) -> None:
        Supervisor.kill(list(self.members.values()))
        self._kill(list(self.pending.values()))
        if self.owned:
            remove_placement_group(self.placement)


def in_tune_trial() -> bool:
    """Whether this process runs a Ray Tune trial. A trial's process has imported Ray
    Train's session module; one that has not is no trial, and importing Ray Train only
    to ask would cost half a second of a cold start."""
    session = sys.modules.get("ray.train._internal.session")
    return session is not None and session.get_session() is not None


def _resolve(
    ray_params: RayParams | dict[str, Any] | None, params: dict[str, Any]
) -> tuple[RayParams, ActorResources, Any]:
    """The parameters with actor count and resources filled in from the cluster, the
    placement strategy, and the caller's placement group when the actors go into it."""
    if ray_params is None:
        ray_params = RayParams()
    elif isinstance(ray_params, dict):
        ray_params = RayParams(**ray_params)
    elif not isinstance(ray_params, RayParams):
        raise ConfigError(
            f"ray_params must be a RayParams, a dict or None, but got {type(ray_params).__name__}"
        )
    current = get_current_placement_group()
    planned: ActorResources | None = None
    if current is not None:
        held = ray.get_runtime_context().get_assigned_resources()
        planned = plan_in_bundles(ray_params, current.bundle_specs, any(held.values()))
    if planned is None:
        current = None
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        planned = plan_actors(ray_params, nodes, params)
        require_resources(
            {"CPU": planned.cpus_per_actor, "GPU": planned.gpus_per_actor},
            planned.num_actors,
            "actor",
        )
    verbose = ray_params.verbose if ray_params.verbose is not None else not in_tune_trial()
    resolved = replace(
        ray_params,
        num_actors=planned.num_actors,
        cpus_per_actor=planned.cpus_per_actor,
        gpus_per_actor=planned.gpus_per_actor,
        verbose=verbose,
    )
    return resolved, planned, current


def _start_gang(
    ray_params: RayParams,
    planned: ActorResources,
    current: Any,
    meanwhile: Callable[[list[Any]], None] | None = None,
) -> _Gang:
    """The gang's actors started (``meanwhile`` runs while they start up; see
    ``_Gang.start``); on any failure, what was started is stopped."""
    if current is not None:
        gang = _Gang(ray_params, current, owned=False, first_bundle=planned.first_bundle)
    else:
        bundle: dict[str, float] = {"CPU": ray_params.cpus_per_actor}
        if ray_params.gpus_per_actor:
            bundle["GPU"] = ray_params.gpus_per_actor
        if ray_params.resources_per_actor:
            bundle.update(ray_params.resources_per_actor)
        placement = reserve_bundles(
            bundle, ray_params.num_actors, "actor", strategy=planned.strategy
        )
        gang = _Gang(ray_params, placement, owned=True)
    try:
        gang.start(list(range(ray_params.num_actors)), meanwhile)
    except BaseException:
        gang.stop()
        raise
    return gang


def _split_datasets(matrices: list[RayDMatrix], n: int) -> None:
    """Split Ray Datasets before the actors start: splitting runs Ray Data tasks, which
    would wait forever once the actors hold every CPU."""
    for matrix in matrices:
        if matrix.dataset is not None:
            matrix.shards(n)


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
    ``_remote`` (XGBoost-Ray's Ray Client switch) is accepted and has no effect.
    Returns an ``xgboost.Booster``."""
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
    if kwargs:  # checked before any actor starts
        _check_keywords(kwargs)
    evals = (
        [evals]
        if isinstance(evals, tuple) and len(evals) == 2 and isinstance(evals[1], str)
        else list(evals)
    )
    for matrix, name in evals:
        if not isinstance(matrix, RayDMatrix):
            raise ConfigError(f"evals entry {name!r} must be a RayDMatrix")
    from unipar.xgboost.tune import TuneReportCallback

    reporters = [c for c in callbacks or [] if isinstance(c, TuneReportCallback)]
    callbacks = [c for c in callbacks or [] if not isinstance(c, TuneReportCallback)]
    started = time.perf_counter()
    attach_or_start_ray(before_starting=_XGBOOST.start)
    rp, planned, current = _resolve(ray_params, params)
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


def _check_keywords(kwargs: dict[str, Any]) -> None:
    """Keywords ``xgboost.train`` does not take fail here, before any actor starts."""
    import inspect

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
    _split_datasets([dtrain, *[m for m, _ in evals]], n)
    split: dict[str, Any] = {}

    def shard_data(actors: list[Any]) -> None:
        # While the actors start: import xgboost here (it competes less with their start
        # once they are requested) and put in-memory data in the object store.
        _XGBOOST.start()
        split["train"] = dtrain.shards(n, actors)
        split["evals"] = [(m, name, m.shards(n, actors)) for m, name in evals]

    gang = _start_gang(rp, *placement, meanwhile=shard_data)
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

        loading = [load_refs(i, a) for i, a in gang.actors.items()]
        try:
            rows = sum(ray.get([refs[0] for refs in loading]))
            ray.get([ref for refs in loading for ref in refs[1:]])
        except RayTaskError as error:
            raise RayXGBoostTrainingError(
                f"an actor failed while loading its data: {error}"
            ) from error
        start: tuple[int, bytes] | None = None
        if xgb_model is not None:
            start = (xgb_model.num_boosted_rounds(), bytes(xgb_model.save_raw("ubj")))
        base_rounds = start[0] if start else 0
        target = base_rounds + rounds
        relay = _TuneRelay(reporters, target) if reporters else None
        history: dict[str, Any] = {}
        failures = restarts = lost = 0
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
            leaving = sorted(gang.leaving - set(dead))
            gang.leaving.clear()
            if leaving:  # they stopped after a round; their node goes away
                Supervisor.kill([gang.members.pop(index) for index in leaving])
            try:
                if tracker is not None:
                    tracker.free()
            except _XGBOOST.result().core.XGBoostError:
                if not dead:  # the tracker only fails on its own when a worker vanished
                    raise
            if not dead and any("error" in r for r in results.values()):
                raise _actor_failure(results)
            if not dead:
                final = next(r for r in results.values() if r["model"] is not None)
                if relay is not None and final["rounds"] == target:
                    relay.finish(final["rounds"], final["evals_result"], final["model"])
                if final["rounds"] < target:  # stopped early: replacements join, drained leave
                    start = (final["rounds"], final["model"])
                    _merge(history, final["evals_result"], done_rounds - base_rounds)
                    if leaving:
                        log.warning(
                            "actors %s leave draining nodes after round %d", leaving, start[0]
                        )
                        _replace(gang, leaving, rp, load_refs)
                    continue
                _merge(history, final["evals_result"], done_rounds - base_rounds)
                return {
                    "model": final["model"],
                    "evals_result": history,
                    "rows": rows,
                    "failures": failures,
                    "restarts": restarts,
                    "num_actors": len(live),
                    "training_time_s": time.perf_counter() - training_started,
                    "callback_returns": queue.returns,
                }
            failures += len(dead)
            for index in dead:
                gang.members.pop(index, None)
            start = _newest_checkpoint(gang, start)
            if rp.elastic_training:
                lost += len(dead)
                if lost > rp.max_failed_actors:
                    raise RayXGBoostTrainingError(
                        f"{lost} actors lost, more than max_failed_actors="
                        f"{rp.max_failed_actors}; raise it or use max_actor_restarts"
                    )
                _replace(gang, dead + leaving, rp, load_refs)
                log.warning("lost actors %s; continuing on %d", dead, len(gang.members))
            else:
                restarts += 1
                if 0 <= rp.max_actor_restarts < restarts:
                    raise RayXGBoostTrainingError(
                        f"actors {dead} died; restarts: {restarts}, more than "
                        f"max_actor_restarts={rp.max_actor_restarts}; raise it (-1: no limit) "
                        "or use elastic_training"
                    )
                _replace(gang, dead + leaving, rp, load_refs)
                log.warning(
                    "replaced actors %s; resuming from round %d", dead, start[0] if start else 0
                )
    finally:
        gang.stop()


def _replace(
    gang: _Gang, shards: list[int], rp: RayParams, load_refs: Callable[[int, Any], list[Any]]
) -> None:
    """New actors for ``shards``: under elastic training they load in the background and
    join at a round boundary; otherwise training waits for them and their data."""
    if rp.elastic_training:
        for index in shards:
            gang.pending[index] = gang.spawn(index)
            gang.loading[index] = load_refs(index, gang.pending[index])
        if not gang.members:  # nobody left to train on (one actor): wait for them
            for index in sorted(gang.pending):
                gang.admit(index)
            if not gang.members:
                raise RayXGBoostTrainingError(
                    "no actor is left to train on: every replacement died while loading or "
                    "sits on a draining node; check the actors' logs, or use more actors"
                )
        return
    gang.start(shards)
    ray.get([ref for index in shards for ref in load_refs(index, gang.members[index].actor)])


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
        wants_model = any(r.checkpoint_every for r in self.reporters)
        for reporter in self.reporters:
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
    refs: dict[int, Any], gang: _Gang, queue: _Queue, relay: _TuneRelay | None = None
) -> tuple[dict[int, Any], list[int]]:
    """Results by shard, and the shards whose actor's process is gone. While training
    runs, takes back replacements whose data finished loading (elastic training), asks
    everyone to stop after the round when an actor's node is draining, and every 0.5 s
    drains the actors' queues. Returns early when an actor raised (not a collective
    error): its peers may wait for it in the collective."""
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
        if any("error" in r and not r["collective"] for r in results.values()):
            break
        _admit_loaded(gang)
        if time.monotonic() >= next_drain_check and not dead:
            next_drain_check = time.monotonic() + _DRAIN_CHECK_S
            _leave_draining(gang, [streams[i].member for i in streams if i not in results])
        live = {i: gang.members[i].actor for i in refs if i not in dead and i in gang.members}
        _drain(live, queue, relay)
    return results, dead


def _leave_draining(gang: _Gang, training: list[Member]) -> None:
    """Members on nodes Ray is draining leave after the current round: every actor is
    asked to stop there (the model of that round is the next attempt's start)."""
    draining = {id(member) for member in on_draining_nodes(training)}
    shards = {i for i, member in gang.members.items() if id(member) in draining} - gang.leaving
    if shards:
        gang.leaving |= shards
        for member in gang.members.values():
            member.actor.request_stop.remote()


def _admit_loaded(gang: _Gang) -> None:
    """Replacements whose data is loaded join at the next round: the live actors are
    asked to stop after the current round and training restarts with everyone."""
    for index in list(gang.pending):
        loading = gang.loading[index]
        done, _ = ray.wait(loading, num_returns=len(loading), timeout=0)
        if len(done) == len(loading) and gang.admit(index):
            for live in gang.actors.values():
                live.request_stop.remote()


def _newest_checkpoint(gang: _Gang, fallback: tuple[int, bytes] | None):  # type: ignore[no-untyped-def]
    found = []
    for actor in gang.actors.values():
        try:
            found.append(ray.get(actor.checkpoint.remote(), timeout=30))
        except Exception:  # a second actor may have died meanwhile
            continue
    found = [c for c in found if c is not None]
    if not found:
        return fallback
    newest = max(found, key=lambda c: c[0])
    return newest if fallback is None or newest[0] >= fallback[0] else fallback


def _merge(history: dict[str, Any], log: dict[str, Any], offset: int) -> None:
    """Evaluation results of an attempt that started after ``offset`` rounds."""
    for data_name, metrics in log.items():
        target = history.setdefault(data_name, {})
        for metric, values in metrics.items():
            target[metric] = list(target.get(metric, []))[:offset] + list(values)


def predict(
    model: xgb.Booster,
    data: RayDMatrix,
    ray_params: RayParams | dict[str, Any] | None = None,
    **kwargs: Any,
) -> np.ndarray:
    """Predict on ``data`` with ``ray_params.num_actors`` actors, in ``data``'s row order."""
    if not isinstance(data, RayDMatrix):
        raise ConfigError(f"data must be a RayDMatrix, but got {type(data).__name__}")
    expected, given = model.feature_names, data.feature_names
    if expected is not None and given is not None and list(expected) != list(given):
        missing = [f for f in expected if f not in given]
        extra = [f for f in given if f not in expected]
        raise ConfigError(
            "the data's feature names differ from the model's: missing "
            f"{missing}, unexpected {extra}"
            + ("" if missing or extra else " (order differs)")
            + "; pass the columns the model was trained on, in the same order"
        )
    attach_or_start_ray()
    rp, planned, current = _resolve(ray_params, {})
    _split_datasets([data], rp.num_actors)
    shards: list[Any] = []  # filled while the actors start
    gang = _start_gang(rp, planned, current, lambda a: shards.extend(data.shards(len(a), a)))
    try:
        raw = bytes(model.save_raw("ubj"))
        outputs = ray.get(
            [actor.predict.remote(data, shards[i], raw, kwargs) for i, actor in gang.actors.items()]
        )
        return _in_data_order(data, shards, outputs)
    finally:
        gang.stop()


def _in_data_order(
    data: RayDMatrix, shards: list[Any], outputs: list[tuple[np.ndarray, list[int]]]
) -> np.ndarray:
    """The actors' predictions put back in the rows' order: in-memory rows by their
    indices; files in the order they were given (an actor may hold files 0, 3, 6...)."""
    parts = [prediction for prediction, _ in outputs]
    if shards[0].indices is not None:
        total = sum(len(part) for part in parts)
        out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
        for shard, part in zip(shards, parts, strict=True):
            out[shard.indices] = part
        return out
    if data.files:
        by_file: dict[int, np.ndarray] = {}
        for shard, (prediction, file_rows) in zip(shards, outputs, strict=True):
            bounds = np.cumsum([0, *file_rows])
            for k, position in enumerate(shard.file_indices):
                by_file[position] = prediction[bounds[k] : bounds[k + 1]]
        return np.concatenate([by_file[k] for k in range(len(data.files))])
    return np.concatenate(parts)
