"""``train`` and ``predict`` across Ray actors, with XGBoost-Ray's fault tolerance.

Training uses xgboost's own collective: a ``RabitTracker`` on the driver, and a
``CommunicatorContext`` in each actor. When an actor dies its peers' collective calls
fail at once; the driver then either replaces the dead actor (``max_actor_restarts``),
or goes on without it (``elastic_training``), and resumes every live actor from the
newest in-memory checkpoint, so the booster ends with exactly ``num_boost_round`` trees.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import xgboost as xgb
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from xgboost.tracker import RabitTracker

from unipar.errors import ConfigError, TrainingFailedError
from unipar.ray_session import ensure_ray, require_resources, reserve_bundles
from unipar.xgboost.actor import XGBoostActor
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams

log = logging.getLogger("unipar.xgboost")


class RayXGBoostTrainingError(TrainingFailedError):
    """Training failed more often than the fault-tolerance settings allow."""


@dataclass
class _Gang:
    """The live actors, by data shard index."""

    params: RayParams
    placement: Any
    actors: dict[int, Any] = field(default_factory=dict)
    pending: dict[int, Any] = field(default_factory=dict)  # replacements still loading
    loading: dict[int, list[Any]] = field(default_factory=dict)  # their load refs

    def spawn(self, shard: int) -> Any:
        options: dict[str, Any] = {
            "num_cpus": self.params.cpus_per_actor,
            "num_gpus": max(0, self.params.gpus_per_actor),
            "max_concurrency": 2,
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=shard
            ),
        }
        if self.params.resources_per_actor:
            options["resources"] = dict(self.params.resources_per_actor)
        return (
            ray.remote(XGBoostActor)
            .options(**options)
            .remote(list(self.params.distributed_callbacks or []))
        )


def _resolve(ray_params: RayParams | dict[str, Any] | None) -> RayParams:
    if ray_params is None:
        ray_params = RayParams()
    elif isinstance(ray_params, dict):
        ray_params = RayParams(**ray_params)
    if ray_params.num_actors < 1:
        raise ConfigError(
            "set the number of training actors: ray_params=RayParams(num_actors=N), with N "
            f">= 1 (got num_actors={ray_params.num_actors})"
        )
    cpus = ray_params.cpus_per_actor or 1
    gpus = ray_params.gpus_per_actor if ray_params.gpus_per_actor >= 0 else 0
    require_resources({"CPU": cpus, "GPU": gpus}, ray_params.num_actors, "actor")
    from dataclasses import replace

    return replace(ray_params, cpus_per_actor=cpus, gpus_per_actor=gpus)


def _start_gang(ray_params: RayParams) -> _Gang:
    bundle: dict[str, float] = {"CPU": ray_params.cpus_per_actor}
    if ray_params.gpus_per_actor:
        bundle["GPU"] = ray_params.gpus_per_actor
    if ray_params.resources_per_actor:
        bundle.update(ray_params.resources_per_actor)
    strategy = ray_params.placement_options.get("strategy", "PACK")
    placement = reserve_bundles(bundle, ray_params.num_actors, "actor", strategy=strategy)
    gang = _Gang(ray_params, placement)
    gang.actors = {i: gang.spawn(i) for i in range(ray_params.num_actors)}
    return gang


def train(
    params: dict[str, Any],
    dtrain: RayDMatrix,
    num_boost_round: int = 10,
    *args: Any,
    evals: Any = (),
    evals_result: dict[str, Any] | None = None,
    additional_results: dict[str, Any] | None = None,
    ray_params: RayParams | dict[str, Any] | None = None,
    xgb_model: xgb.Booster | None = None,
    callbacks: list[Any] | None = None,
    **kwargs: Any,
) -> xgb.Booster:
    """Train a booster on ``dtrain`` across ``ray_params.num_actors`` Ray actors; the same
    arguments as ``xgboost.train`` plus ``ray_params``. Returns an ``xgboost.Booster``."""
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
    evals = list(evals)
    for matrix, name in evals:
        if not isinstance(matrix, RayDMatrix):
            raise ConfigError(f"evals entry {name!r} must be a RayDMatrix")
    from unipar.xgboost.tune import TuneReportCallback

    reporters = [c for c in callbacks or [] if isinstance(c, TuneReportCallback)]
    callbacks = [c for c in callbacks or [] if not isinstance(c, TuneReportCallback)]
    started = time.perf_counter()
    ensure_ray()
    rp = _resolve(ray_params)
    params = {"nthread": int(rp.cpus_per_actor), **params}
    outcome = _train(
        params, dtrain, num_boost_round, evals, rp, xgb_model, callbacks, kwargs, reporters
    )
    booster = xgb.Booster(model_file=bytearray(outcome["model"]))
    if evals_result is not None:
        evals_result.clear()
        evals_result.update(outcome["evals_result"])
    if additional_results is not None:
        additional_results.update(
            training_time_s=time.perf_counter() - started,
            total_n=outcome["rows"],
            failures=outcome["failures"],
            restarts=outcome["restarts"],
            num_actors=outcome["num_actors"],
        )
    return booster


def _train(
    params, dtrain, rounds, evals, rp, xgb_model, callbacks, kwargs, reporters
) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    n = rp.num_actors
    gang = _start_gang(rp)
    try:
        by_shard = [gang.actors[i] for i in range(n)]
        shards = dtrain.shards(n, by_shard)
        eval_shards = [(m, name, m.shards(n, by_shard)) for m, name in evals]

        def load_refs(index: int, actor: Any) -> list[Any]:
            refs = [actor.load.remote("train", dtrain, shards[index])]
            refs += [actor.load.remote(name, m, s[index]) for m, name, s in eval_shards]
            return refs

        loading = [load_refs(i, a) for i, a in gang.actors.items()]
        rows = sum(ray.get([refs[0] for refs in loading]))
        ray.get([ref for refs in loading for ref in refs[1:]])
        start: tuple[int, bytes] | None = None
        if xgb_model is not None:
            start = (xgb_model.num_boosted_rounds(), bytes(xgb_model.save_raw("ubj")))
        base_rounds = start[0] if start else 0
        target = base_rounds + rounds
        relay = _TuneRelay(reporters, target) if reporters else None
        history: dict[str, Any] = {}
        failures = restarts = lost = 0
        while True:
            live = dict(gang.actors)
            tracker = RabitTracker(n_workers=len(live), host_ip=ray.util.get_node_ip_address())
            tracker.start()
            done_rounds = start[0] if start else 0
            refs = {
                i: actor.train.remote(
                    tracker.worker_args(),
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
            results, dead = _wait(refs, gang, relay)
            try:
                tracker.free()
            except xgb.core.XGBoostError:
                if not dead:  # the tracker only fails on its own when a worker vanished
                    raise
            if not dead and all("error" not in r for r in results.values()):
                final = next(r for r in results.values() if r["model"] is not None)
                if relay is not None and final["rounds"] == target:
                    first = gang.actors[next(iter(refs))]
                    relay.finish(first, final["rounds"], final["evals_result"], final["model"])
                elif relay is not None:
                    relay.poll(gang.actors[next(iter(refs))])
                if final["rounds"] < target:  # stopped early to take replacements back
                    start = (final["rounds"], final["model"])
                    _merge(history, final["evals_result"], done_rounds - base_rounds)
                    continue
                _merge(history, final["evals_result"], done_rounds - base_rounds)
                return {
                    "model": final["model"],
                    "evals_result": history,
                    "rows": rows,
                    "failures": failures,
                    "restarts": restarts,
                    "num_actors": len(live),
                }
            if not dead:
                errors = [r["error"] for r in results.values() if "error" in r]
                raise RayXGBoostTrainingError(f"training failed on the actors: {errors[0]}")
            failures += len(dead)
            for index in dead:
                gang.actors.pop(index, None)
            start = _newest_checkpoint(gang, start)
            if rp.elastic_training:
                lost += len(dead)
                if lost > rp.max_failed_actors:
                    raise RayXGBoostTrainingError(
                        f"{lost} actors lost, more than max_failed_actors="
                        f"{rp.max_failed_actors}; raise it or use max_actor_restarts"
                    )
                for index in dead:  # replacements load in the background
                    gang.pending[index] = gang.spawn(index)
                    gang.loading[index] = load_refs(index, gang.pending[index])
                log.warning("lost actors %s; continuing on %d", dead, len(gang.actors))
            else:
                restarts += 1
                if restarts > rp.max_actor_restarts:
                    raise RayXGBoostTrainingError(
                        f"actors failed {restarts} times, more than max_actor_restarts="
                        f"{rp.max_actor_restarts}; raise it or use elastic_training"
                    )
                for index in dead:
                    gang.actors[index] = gang.spawn(index)
                    ray.get(load_refs(index, gang.actors[index]))
                log.warning(
                    "replaced actors %s; resuming from round %d", dead, start[0] if start else 0
                )
    finally:
        for actor in [*gang.actors.values(), *gang.pending.values()]:
            ray.kill(actor, no_restart=True)
        remove_placement_group(gang.placement)


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

    def poll(self, actor: Any) -> None:
        try:
            self.pass_on(ray.get(actor.drain_rounds.remote(), timeout=10))
        except Exception:  # that actor died: its failure is handled by the caller
            return

    def finish(self, actor: Any, rounds: int, evals_result: dict[str, Any], model: bytes) -> None:
        self.poll(actor)
        values = {f"{d}-{m}": v[-1] for d, ms in evals_result.items() for m, v in ms.items()}
        wants_model = any(r.checkpoint_every for r in self.reporters)
        for reporter in self.reporters:
            reporter.report(rounds, values, model if wants_model else None)
        self.reported = rounds


def _wait(
    refs: dict[int, Any], gang: _Gang, relay: _TuneRelay | None = None
) -> tuple[dict[int, Any], list[int]]:
    """Results by shard, and the shards whose actor died. While training runs, takes
    back replacements whose data finished loading (elastic training), and passes each
    finished round to the Tune reporters (all actors log the same global metrics, so
    one actor's log is drained)."""
    results: dict[int, Any] = {}
    dead: list[int] = []
    index_of = {ref: i for i, ref in refs.items()}
    pending = list(refs.values())
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        for ref in ready:
            try:
                results[index_of[ref]] = ray.get(ref)
            except (RayActorError, RayTaskError) as error:
                if isinstance(error, RayTaskError) and not isinstance(error.cause, RayActorError):
                    raise
                dead.append(index_of[ref])
        _admit_loaded(gang)
        if relay is not None and pending:
            relay.poll(gang.actors[next(iter(refs))])
    return results, dead


def _admit_loaded(gang: _Gang) -> None:
    """Replacements whose data is loaded join at the next round: the live actors are
    asked to stop after the current round and training restarts with everyone."""
    for index in list(gang.pending):
        loading = gang.loading[index]
        done, _ = ray.wait(loading, num_returns=len(loading), timeout=0)
        if len(done) == len(loading):
            gang.actors[index] = gang.pending.pop(index)
            del gang.loading[index]
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
    ensure_ray()
    rp = _resolve(ray_params)
    gang = _start_gang(rp)
    try:
        raw = bytes(model.save_raw("ubj"))
        shards = data.shards(rp.num_actors, [gang.actors[i] for i in range(rp.num_actors)])
        parts = ray.get(
            [actor.predict.remote(data, shards[i], raw, kwargs) for i, actor in gang.actors.items()]
        )
        if shards[0].indices is not None:
            indices = ray.get([s.indices for s in shards])
            total = sum(len(i) for i in indices)
            out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
            for index, part in zip(indices, parts, strict=True):
                out[index] = part
            return out
        return np.concatenate(parts)
    finally:
        for actor in gang.actors.values():
            ray.kill(actor, no_restart=True)
        remove_placement_group(gang.placement)
