"""A step as blocks in time, one row per pipeline stage: the predicted one, built from the
cost model's durations in the order torch's pipeline schedule runs the actions, and the
measured one (:mod:`unipar.viz.trace`). Pure arithmetic, no drawing.

Durations per action (``plan/cost.py``): a stage's compute for one micro-batch is the sum
of its layers' times, of which forward is 1, backward 2 and full recompute 1 more forward
pass (Narayanan et al. 2021, Sec. 5.1); tensor-parallel all-reduces split evenly between
the passes that make them; each forward and backward ends with its point-to-point send
(the cost model's p2p term divided over its 2 x m x v transfers); gradient sync (the
exposed part) and the optimizer close the step on every rank.

Start times follow the dependencies of the schedule: a forward waits for the previous
stage's forward of the same micro-batch (and its send), a backward for the next stage's
backward (the last stage's for its own forward). What is left idle on a rank is its
bubble. With equal stages this equals the cost model's closed form (m + p - 1 micro-batch
times for GPipe, m + (p - 1)/v for 1F1B, Narayanan et al. 2021, Sec. 2.2) up to the
sends on the fill and drain path, which the closed form leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.plan.cost import CostModel
from unipar.plan.predict import stage_layers
from unipar.plan.representation import Recompute
from unipar.plan.strategy_search import Candidate
from unipar.viz.schedule_order import Action, ActionKind, pipeline_order


class BlockKind(Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    TP_COMM = "tp comm"
    P2P = "p2p send"
    GRAD_SYNC = "grad sync"
    OPTIMIZER = "optimizer"


COMPUTE_KINDS = (BlockKind.FORWARD, BlockKind.BACKWARD, BlockKind.RECOMPUTE)


@dataclass(frozen=True)
class Block:
    rank: int
    stage: int
    kind: BlockKind
    microbatch: int | None
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Timeline:
    """One optimizer step. ``stages``: the pipeline stages (rows), ``stage % pp`` is the
    rank holding each. ``predicted_bubble_share``: the cost model's bubble term over its
    step time, where the timeline is a prediction."""

    title: str
    pp: int
    stages: int
    blocks: tuple[Block, ...]
    predicted_bubble_share: float | None = None

    @property
    def step_s(self) -> float:
        start = min((b.start_s for b in self.blocks), default=0.0)
        return max((b.end_s for b in self.blocks), default=0.0) - start

    def busy_s(self, rank: int) -> float:
        """Time ``rank`` is doing anything (its blocks never overlap)."""
        return sum(b.seconds for b in self.blocks if b.rank == rank)

    def bubble_share(self, rank: int) -> float:
        """Share of the step ``rank`` sits idle."""
        step = self.step_s
        return (step - self.busy_s(rank)) / step if step else 0.0

    @property
    def bubble(self) -> float:
        """The bubble share of the busiest rank (the one that sets the step time, as the
        cost model's bubble term is that of its slowest stage)."""
        busiest = max(range(self.pp), key=self.busy_s)
        return self.bubble_share(busiest)

    def idle_gaps(self, rank: int) -> list[tuple[float, float]]:
        """(start, end) of each stretch ``rank`` is idle within the step."""
        start = min(b.start_s for b in self.blocks)
        gaps, cursor = [], start
        for block in sorted((b for b in self.blocks if b.rank == rank), key=lambda b: b.start_s):
            if block.start_s > cursor + 1e-12:
                gaps.append((cursor, block.start_s))
            cursor = max(cursor, block.end_s)
        end = start + self.step_s
        if end > cursor + 1e-12:
            gaps.append((cursor, end))
        return gaps


@dataclass(frozen=True)
class ActionTimes:
    """Seconds of one micro-batch's passes through one stage."""

    forward: float
    backward: float
    recompute: float
    tp_forward: float  # tp all-reduces of the forward, and of the backward
    tp_recompute: float  # tp all-reduces of the recomputed forward
    p2p: float  # one send


def action_times(
    candidate: Candidate, profile: ModelProfile, cluster: ClusterSpec
) -> list[ActionTimes]:
    """The cost model's durations of each stage's passes for ``candidate``."""
    plan = candidate.plan
    model = CostModel(profile, cluster)
    compute, comm = model.layer_times(plan)
    # The cost model's passes per micro-batch: forward 1, backward 2, plus the
    # recomputed share of a forward (``recomputed_fraction`` where plans have one).
    again = float(getattr(plan, "recomputed_fraction", plan.recompute is Recompute.FULL))
    passes, comm_passes = 3 + again, 2 + again
    m, v = plan.num_microbatches, plan.virtual_stages
    p2p = candidate.estimate.time.p2p_s / (2 * m * v) if plan.mesh.pp > 1 else 0.0
    times = []
    for layers in stage_layers(plan, len(profile.layers)):
        c = sum(float(compute[model.layer_index[i]]) for i in layers) / passes
        t = sum(float(comm[model.layer_index[i]]) for i in layers) / comm_passes
        times.append(ActionTimes(c, 2 * c, again * c, t, again * t, p2p))
    return times


def predicted_timeline(
    candidate: Candidate, profile: ModelProfile, cluster: ClusterSpec, title: str = ""
) -> Timeline:
    """The cost model's step for ``candidate``, in torch's schedule order."""
    plan = candidate.plan
    times = action_times(candidate, profile, cluster)
    order = pipeline_order(plan.schedule, plan.mesh.pp, plan.num_microbatches, plan.virtual_stages)
    blocks = simulate(order, times)
    estimate = candidate.estimate.time
    tail = [
        (BlockKind.GRAD_SYNC, estimate.grad_sync_s),
        (BlockKind.OPTIMIZER, estimate.optimizer_s),
    ]
    for rank in range(plan.mesh.pp):
        end = max(b.end_s for b in blocks if b.rank == rank)
        for kind, seconds in tail:
            if seconds > 0:
                blocks.append(Block(rank, rank, kind, None, end, end + seconds))
                end += seconds
    return Timeline(
        title=title,
        pp=plan.mesh.pp,
        stages=len(times),
        blocks=tuple(blocks),
        predicted_bubble_share=estimate.pipeline_bubble_s / candidate.estimate.step_time_s,
    )


def _action_blocks(action: Action, rank: int, times: ActionTimes, start: float) -> list[Block]:
    if action.kind is ActionKind.FORWARD:
        parts = [(BlockKind.FORWARD, times.forward), (BlockKind.TP_COMM, times.tp_forward)]
    else:
        parts = [
            (BlockKind.RECOMPUTE, times.recompute),
            (BlockKind.TP_COMM, times.tp_recompute),
            (BlockKind.BACKWARD, times.backward),
            (BlockKind.TP_COMM, times.tp_forward),
        ]
    parts.append((BlockKind.P2P, times.p2p))
    blocks, cursor = [], start
    for kind, seconds in parts:
        if seconds > 0 or kind in (BlockKind.FORWARD, BlockKind.BACKWARD):
            blocks.append(
                Block(rank, action.stage, kind, action.microbatch, cursor, cursor + seconds)
            )
            cursor += seconds
    return blocks


def simulate(order: dict[int, list[Action]], times: Sequence[ActionTimes]) -> list[Block]:
    """Blocks of every action, each starting when its rank is free and its input is there
    (see module doc). Ranks run their actions strictly in ``order``."""
    last_stage = len(times) - 1
    done: dict[tuple[int, ActionKind, int], float] = {}
    position = dict.fromkeys(order, 0)
    free = dict.fromkeys(order, 0.0)
    blocks: list[Block] = []
    remaining = sum(len(actions) for actions in order.values())
    while remaining:
        progressed = False
        for rank, actions in order.items():
            while position[rank] < len(actions):
                action = actions[position[rank]]
                ready = _ready_time(action, done, last_stage)
                if ready is None:
                    break
                new = _action_blocks(action, rank, times[action.stage], max(free[rank], ready))
                blocks.extend(new)
                free[rank] = new[-1].end_s
                done[(action.stage, action.kind, action.microbatch)] = free[rank]
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ConfigError("the pipeline order deadlocks: an action waits on one never run")
    return blocks


def _ready_time(
    action: Action, done: dict[tuple[int, ActionKind, int], float], last_stage: int
) -> float | None:
    s, i = action.stage, action.microbatch
    if action.kind is ActionKind.FORWARD:
        needed = [(s - 1, ActionKind.FORWARD, i)] if s > 0 else []
    elif s == last_stage:
        needed = [(s, ActionKind.FORWARD, i)]
    else:
        needed = [(s + 1, ActionKind.BACKWARD, i), (s, ActionKind.FORWARD, i)]
    if any(key not in done for key in needed):
        return None
    return max((done[key] for key in needed), default=0.0)
