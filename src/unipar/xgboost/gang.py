"""The XGBoost actors of one ``train`` or ``predict`` call: their parameters resolved
against the cluster, their placement group, their start, replacement (XGBoost-Ray's
``max_actor_restarts``, or in the background under ``elastic_training``), nodes being
drained, and the newest in-memory checkpoint among them."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import get_current_placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from unipar.errors import ConfigError
from unipar.ray_cluster.session import require_resources, reserve_bundles
from unipar.ray_cluster.supervisor import (
    PROCESS_LOST,
    Member,
    Supervisor,
    describe_each,
    on_draining_nodes,
)
from unipar.xgboost.actor import XGBoostActor
from unipar.xgboost.exceptions import RayXGBoostTrainingError
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams
from unipar.xgboost.resources import ActorResources, plan_actors, plan_in_bundles

log = logging.getLogger("unipar.xgboost")

START_TIMEOUT_S = 300.0  # an actor's constructor (placement already reserved)
# The actor class as Ray runs it (XGBoost-Ray's name).
_RemoteRayXGBoostActor = ray.remote(XGBoostActor)


@dataclass
class Gang:
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
    rows: dict[int, int] = field(default_factory=dict)  # training rows each shard holds
    # Stops everything at the end, as shutdown_actors (the caller's hook when given).
    shutdown: Callable[..., None] | None = None

    @property
    def actors(self) -> dict[int, Any]:
        return {shard: member.actor for shard, member in self.members.items()}

    def by_rank(self) -> list[Any]:
        """The live actors by data shard, None where a shard has none (XGBoost-Ray's
        actor list)."""
        return [
            self.members[shard].actor if shard in self.members else None
            for shard in range(self.params.num_actors)
        ]

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
        for shard, member in zip(shards, describe_each(actors, START_TIMEOUT_S), strict=True):
            if not isinstance(member, Member):
                self._kill(actors)
                raise RayXGBoostTrainingError(
                    f"the actor for data shard {shard} did not start: {member}",
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
            self.rows[shard] = ray.get(self.loading[shard])[0]
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
        return _RemoteRayXGBoostActor.options(**options).remote(
            rank=shard,
            num_actors=self.params.num_actors,
            distributed_callbacks=list(self.params.distributed_callbacks or []),
        )

    def stop(self) -> None:
        (self.shutdown or shutdown_actors)(
            self.by_rank(),
            pending_actors=self.pending,
            placement_group=self.placement if self.owned else None,
        )


def shutdown_actors(
    actors: list[Any],
    pending_actors: dict[int, Any] | None = None,
    placement_group: Any = None,
) -> None:
    """Stop the actors of a ``train`` or ``predict`` call: ``actors`` by rank (None
    where one was lost), ``pending_actors`` (replacements still loading), and remove
    their ``placement_group`` (when the call made it)."""
    for actor in [*(a for a in actors if a is not None), *(pending_actors or {}).values()]:
        ray.kill(actor, no_restart=True)
    if placement_group is not None:
        remove_placement_group(placement_group)


def in_tune_trial() -> bool:
    """Whether this process runs a Ray Tune trial. A trial's process has imported Ray
    Train's session module; one that has not is no trial, and importing Ray Train only
    to ask would cost half a second of a cold start."""
    session = sys.modules.get("ray.train._internal.session")
    return session is not None and session.get_session() is not None


def resolve_params(
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


def start_gang(
    ray_params: RayParams,
    planned: ActorResources,
    current: Any,
    meanwhile: Callable[[list[Any]], None] | None = None,
    shutdown: Callable[..., None] | None = None,
) -> Gang:
    """The gang's actors started (``meanwhile`` runs while they start up; see
    ``Gang.start``); on any failure, what was started is stopped (by ``shutdown``, when
    given, as at the end)."""
    if current is not None:
        gang = Gang(ray_params, current, owned=False, first_bundle=planned.first_bundle)
    else:
        bundle: dict[str, float] = {"CPU": ray_params.cpus_per_actor}
        if ray_params.gpus_per_actor:
            bundle["GPU"] = ray_params.gpus_per_actor
        if ray_params.resources_per_actor:
            bundle.update(ray_params.resources_per_actor)
        placement = reserve_bundles(
            bundle, ray_params.num_actors, "actor", strategy=planned.strategy
        )
        gang = Gang(ray_params, placement, owned=True)
    if shutdown is not None:
        gang.shutdown = shutdown
    try:
        gang.start(list(range(ray_params.num_actors)), meanwhile)
    except BaseException:
        gang.stop()
        raise
    return gang


def split_datasets(matrices: list[RayDMatrix], n: int) -> None:
    """Split Ray Datasets before the actors start: splitting runs Ray Data tasks, which
    would wait forever once the actors hold every CPU."""
    for matrix in matrices:
        if matrix.dataset is not None:
            matrix.shards(n)


def replace_actors(
    gang: Gang,
    shards: list[int],
    rp: RayParams,
    load_refs: Callable[[int, Any], list[Any]],
    losses: Losses,
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
    load_shards(gang, shards, load_refs, losses)


@dataclass
class Losses:
    """The actors one ``train`` call lost, against XGBoost-Ray's limits: under elastic
    training at most ``max_failed_actors`` actors, else at most ``max_actor_restarts``
    restarts of the gang (-1: no limit)."""

    failures: int = 0  # actors that died
    restarts: int = 0  # times the gang restarted with replacements (restart mode)

    def count(self, dead: list[int], rp: RayParams, when: str) -> None:
        """Count the actors of data shards ``dead``, lost ``when``; raise past a limit."""
        self.failures += len(dead)
        if rp.elastic_training:
            if self.failures > rp.max_failed_actors:
                raise RayXGBoostTrainingError(
                    f"the actors for data shards {dead} died {when}; {self.failures} actors "
                    f"lost, more than max_failed_actors={rp.max_failed_actors}; raise it or "
                    "use max_actor_restarts"
                )
            return
        self.restarts += 1
        if 0 <= rp.max_actor_restarts < self.restarts:
            raise RayXGBoostTrainingError(
                f"the actors for data shards {dead} died {when}; restarts: {self.restarts}, "
                f"more than max_actor_restarts={rp.max_actor_restarts}; raise it (-1: no "
                "limit) or use elastic_training"
            )


def load_shards(
    gang: Gang,
    shards: list[int],
    load_refs: Callable[[int, Any], list[Any]],
    losses: Losses,
) -> int:
    """The members of ``shards`` read their data (their training rows in all); a member
    whose process dies while loading is replaced and its shard read again, counted in
    ``losses`` as a death in training is."""
    todo = sorted(shards)
    while todo:
        refs = {index: load_refs(index, gang.members[index].actor) for index in todo}
        dead = []
        for index, shard_refs in refs.items():
            try:
                gang.rows[index] = ray.get(shard_refs)[0]
            except PROCESS_LOST:
                dead.append(index)
            except RayTaskError as error:
                raise RayXGBoostTrainingError(
                    f"the actor for data shard {index} failed while loading its data: {error}",
                    actor_rank=index,
                ) from error
        if dead:
            losses.count(dead, gang.params, "while loading their data")
            log.warning("actors %s died while loading their data; replacing them", dead)
            Supervisor.kill([gang.members.pop(index) for index in dead])
            gang.start(dead)
        todo = dead
    return sum(gang.rows[index] for index in shards)


def leave_draining(gang: Gang, training: list[Member]) -> None:
    """Members on nodes Ray is draining leave after the current round: every actor is
    asked to stop there (the model of that round is the next attempt's start)."""
    draining = {id(member) for member in on_draining_nodes(training)}
    shards = {i for i, member in gang.members.items() if id(member) in draining} - gang.leaving
    if shards:
        gang.leaving |= shards
        for member in gang.members.values():
            member.actor.request_stop.remote()


def admit_loaded(gang: Gang) -> None:
    """Replacements whose data is loaded join at the next round: the live actors are
    asked to stop after the current round and training restarts with everyone."""
    for index in list(gang.pending):
        loading = gang.loading[index]
        done, _ = ray.wait(loading, num_returns=len(loading), timeout=0)
        if len(done) == len(loading) and gang.admit(index):
            for live in gang.actors.values():
                live.request_stop.remote()


def newest_checkpoint(gang: Gang, fallback: tuple[int, bytes] | None):  # type: ignore[no-untyped-def]
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
