"""The cost model's prediction of one given plan, and of the parts of it a run can
measure, split among the rate groups that learned corrections scale
(:mod:`unipar.cluster.corrections`). Pure arithmetic.

A group's share of a predicted time is its derivative by the group's time factor
(``(t(x_g = 1 + eps) - t(1)) / eps``): the cost model is a sum of terms each priced by
one group's rate, maxima and sums of such terms, so it is homogeneous of degree one in
the groups' time factors and the shares sum to the prediction (Euler's theorem for
homogeneous functions). Where a maximum switches between its terms as the factors move
(communication hidden behind compute on a GPU, until it is longer), the shares are the
slopes at the rates as specified: the fit's linear model is then exact near them, and
an approximation far from them; on CPU workers, which overlap nothing, it is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from unipar.analysis.profile import ModelProfile
from unipar.cluster.corrections import Rate, base_cluster, scaled_times
from unipar.cluster.run_records import Measured, Observation
from unipar.cluster.spec import AttentionKernel, ClusterSpec
from unipar.errors import ConfigError
from unipar.plan.cost import CostModel, Estimate
from unipar.plan.representation import Plan, Recompute

_EPS = 1e-3


def stage_layers(plan: Plan, num_layers: int) -> list[list[int]]:
    """Layer indices of each of the plan's ``pp x virtual_stages`` stages."""
    bounds = [0, *plan.stage_boundaries, num_layers]
    chunks = plan.mesh.pp * plan.virtual_stages
    if len(bounds) != chunks + 1:
        raise ConfigError(
            f"the plan's stage_boundaries {list(plan.stage_boundaries)} must cut "
            f"{num_layers} layers into pp x virtual_stages = {chunks} stages; use a plan "
            "made by the planner for this model"
        )
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def estimate_plan(profile: ModelProfile, plan: Plan, cluster: ClusterSpec) -> Estimate:
    """The cost model's estimate of ``plan`` (its own stage boundaries) on ``cluster``."""
    return CostModel(profile, cluster).estimate(plan, stage_layers(plan, len(profile.layers)))


@dataclass(frozen=True)
class MeasuredTimes:
    """What a run measured, per step in its steady state: the step (every run); the
    forward passes and the optimizer per rank, where its steps were traced."""

    step_s: float
    forward_s: float | None = None
    optimizer_s: float | None = None


Quantity = Callable[[CostModel, Plan, list[list[int]]], float]


def _step(model: CostModel, plan: Plan, stages: list[list[int]]) -> float:
    return model.estimate(plan, stages).step_time_s


def _optimizer(model: CostModel, plan: Plan, stages: list[list[int]]) -> float:
    return model.estimate(plan, stages).time.optimizer_s


def _forward(model: CostModel, plan: Plan, stages: list[list[int]]) -> float:
    """The forward passes of one step, averaged over the pipeline ranks (as the trace
    measures them): a third of each micro-batch's compute (forward 1, backward 2)."""
    compute, _ = model.layer_times(plan)
    per_rank = model.rank_loads(stages, plan.mesh.pp).counts @ compute
    return float(per_rank.mean()) * plan.num_microbatches / 3


def forward_is_compute(plan: Plan, cluster: ClusterSpec) -> bool:
    """Whether a traced forward holds compute alone (no tensor, context or sharded
    data-parallel communication inside it, no recompute) and the cost model's forward
    is a third of its compute (attention on the math path: backward twice the
    forward)."""
    mesh = plan.mesh
    return (
        (mesh.tp, mesh.fsdp, mesh.cp) == (1, 1, 1)
        and plan.recompute is Recompute.NONE
        and cluster.device.attention is AttentionKernel.MATH
    )


def optimizer_is_plain(plan: Plan) -> bool:
    """Whether the optimizer steps whole, plain tensors on one stage (data parallel):
    a traced optimizer step is then the cost model's optimizer term alone."""
    mesh = plan.mesh
    return (mesh.tp, mesh.fsdp, mesh.pp, mesh.cp) == (1, 1, 1, 1) and not (
        plan.distributed_optimizer
    )


def seconds_by_rate(
    profile: ModelProfile, plan: Plan, cluster: ClusterSpec, quantity: Quantity = _step
) -> tuple[float, tuple[tuple[Rate, float], ...]]:
    """``quantity`` of ``plan`` on ``cluster`` as specified (corrections left out), and
    its share of each rate group (module doc)."""
    base = base_cluster(cluster)
    stages = stage_layers(plan, len(profile.layers))
    value = quantity(CostModel(profile, base), plan, stages)
    shares = []
    for rate in Rate:
        slower = scaled_times(base, rate, 1 + _EPS)
        moved = quantity(CostModel(profile, slower), plan, stages)
        shares.append((rate, max(0.0, (moved - value) / _EPS)))
    return value, tuple(shares)


def observations(
    profile: ModelProfile, plan: Plan, cluster: ClusterSpec, measured: MeasuredTimes
) -> tuple[Observation, ...]:
    """The measured quantities of a run of ``plan`` on ``cluster``, each with the
    uncorrected prediction and its shares: the step; the forward and the optimizer
    where the trace measured them and they hold only what the cost model prices
    them by (:func:`forward_is_compute`, :func:`optimizer_is_plain`)."""
    wanted: list[tuple[Measured, float, Quantity]] = [(Measured.STEP, measured.step_s, _step)]
    if measured.forward_s and forward_is_compute(plan, base_cluster(cluster)):
        wanted.append((Measured.FORWARD, measured.forward_s, _forward))
    if measured.optimizer_s and optimizer_is_plain(plan):
        wanted.append((Measured.OPTIMIZER, measured.optimizer_s, _optimizer))
    found = []
    for what, seconds, quantity in wanted:
        predicted, shares = seconds_by_rate(profile, plan, cluster, quantity)
        if predicted > 0:
            found.append(Observation(what, seconds, predicted, shares))
    return tuple(found)
