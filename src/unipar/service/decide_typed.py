"""One scheduling round of the live service on a cluster of several node types (pure).

The policy is a typed :mod:`unipar.sched` policy (unipar's ``TypedGoodputPolicy`` by
default), the very object ``unipar simulate --cluster`` drives: each round it puts every
job on workers of **one** type, by goodput. What it sees of a live job
(:func:`typed_job_view`):

- per type the job's workers held, Pollux's throughput model fitted on the seconds per step
  they measured there (:func:`unipar.service.decide.fitted_model`), and pooled over the
  jobs of the same name;
- its declared samples per second on one worker of each type (``submit(...,
  throughput={"a": 100, "b": 200})``): the profile Sia takes of a new job (Jayaram
  Subramanya et al., SOSP'23, §4), with which the policy predicts a type nothing ran on
  from a type measured (the model there times the two types' ratio), and a job that has
  not run yet at all. A type the job does not name counts as fast as its slowest named
  one; a job that names none counts every type as fast (until measured);
- a fixed global batch (statistical efficiency 1, as on a cluster of one type), its steps
  left, and the re-formation's measured pause as its restart seconds (Pollux's
  reallocation factor weighs a move against it).

The policy's answer is then fitted to what a job can run (:func:`typed_targets`): a
worker count its batch splits over, at least its least size, within the type's free
workers; a running job whose new place does not fit keeps its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unipar.sched.typed_cluster import TypedAllocation, TypedCluster
from unipar.sched.typed_policy import LocalLimits, TypedJobView, TypedPolicy, TypedRoundState
from unipar.service.decide import PRIORITY_S, ResizeCost, down_to, fitted_model
from unipar.service.state import JobRow, JobState


@dataclass(frozen=True)
class Placement:
    """Workers of one node type for a job (0 workers: it stays queued)."""

    gpu_type: str
    workers: int


def declared_profile(row: JobRow, types: Sequence[str]) -> dict[str, float]:
    """Samples per second on one worker of each type, as the job declared them (see the
    module's docstring for a type it does not name)."""
    declared = row.throughput or {}
    fill = min(declared.values(), default=1.0)
    return {t: declared.get(t, fill) for t in types}


def _nodes(cluster: TypedCluster, gpu_type: str, workers: int) -> tuple[tuple[int, int], ...]:
    """``workers`` on the nodes of ``gpu_type``, filled in order (the policy re-places
    them; only the type and the count matter to it)."""
    per_node = cluster.gpu_type(gpu_type).gpus_per_node
    out, left = [], workers
    for node in cluster.nodes_of(gpu_type):
        if left <= 0:
            break
        out.append((node, min(per_node, left)))
        left -= per_node
    return tuple(out)


def typed_job_view(row: JobRow, now: float, peers: Sequence[JobRow], cluster: TypedCluster,
                   restart_s: float) -> TypedJobView:
    """``row`` as a typed policy sees it; ``peers``: jobs of the same name."""
    types = cluster.type_names
    running = row.state is JobState.RUNNING and row.target > 0 and row.gpu_type in types

    def models(rows: Sequence[JobRow]) -> dict:
        return {t: m for t in types if (m := fitted_model(rows, t)) is not None}

    def seen(rows: Sequence[JobRow]) -> dict[str, int]:
        sizes = {t: [k for r in rows for k in (r.typed_step_times or {}).get(t, {})]
                 for t in types}
        return {t: max(k) for t, k in sizes.items() if k}

    return TypedJobView(
        name=str(row.id),
        application=row.name,
        submit_time=row.submitted - PRIORITY_S * row.priority,
        requested_replicas=max(row.sizes),
        requested_batch=row.batch,
        init_batch=row.batch,
        max_batch=row.batch,  # a fixed global batch
        limits={t: LocalLimits(1, row.batch) for t in types},
        restart_seconds=restart_s,
        epoch=0,
        progress=float(row.step),
        remaining_progress=float(row.steps - row.step),
        attained_service=row.worker_seconds,
        restarts=row.restarts,
        restart_left=0.0,
        allocation=TypedAllocation(row.gpu_type, _nodes(cluster, row.gpu_type, row.target))
        if running else None,
        grad=(1.0, 0.0),  # efficiency 1: the batch is fixed
        models=models([row]),
        seen=seen([row]),
        pooled_models=models(peers),
        pooled_seen=seen(peers),
        profile=declared_profile(row, types),
    )


def typed_targets(
    policy: TypedPolicy,
    rows: Sequence[JobRow],
    cluster: TypedCluster,
    now: float,
    interval_s: float,
    cost: ResizeCost | None = None,
) -> dict[int, Placement]:
    """A node type and a worker count for each queued or running job (0: stays queued).

    Running jobs are fitted first (they hold their workers), then the queue in order of
    submission: each gets the policy's count rounded down to a size its batch splits over
    within its type's free workers, at least its least size where that fits; a running
    job the policy leaves out, or whose new place does not fit, keeps its place."""
    live = [r for r in rows if not r.state.ended]
    pause = (cost or ResizeCost()).pause
    views = [typed_job_view(r, now, [p for p in rows if p.name == r.name], cluster, pause)
             for r in live]
    chosen = policy.allocate(TypedRoundState(now=now, cluster=cluster, jobs=views,
                                             interval=interval_s))
    free = {t: cluster.gpus(t) for t in cluster.type_names}
    order = sorted(live, key=lambda r: (r.target == 0, r.submitted - PRIORITY_S * r.priority))
    out: dict[int, Placement] = {}
    for r in order:
        held = Placement(r.gpu_type, r.target) if r.target > 0 and r.gpu_type in free else None
        given = chosen.get(str(r.id))
        place = Placement("", 0)
        if given is not None:
            sizes = [s for s in r.sizes if s <= free[given.gpu_type]]
            count = down_to(sizes, given.replicas) or (sizes[0] if sizes else 0)
            place = Placement(given.gpu_type, count)
        if place.workers == 0 and held is not None:
            place = held
        out[r.id] = place
        if place.workers:
            free[place.gpu_type] -= place.workers
    return out
