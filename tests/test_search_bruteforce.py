"""The search finds the optimum that exhaustive enumeration of every plan finds, every
layer-to-stage partition included, on small cases."""

from __future__ import annotations

import itertools
import random

import pytest

from unipar.analysis import analyze
from unipar.analysis.profile import LayerKind
from unipar.cluster import cluster_preset
from unipar.models import GPTConfig
from unipar.plan import PipelineSchedule, Plan, Recompute, search
from unipar.plan.cost import CostModel
from unipar.plan.partition import balanced_partition
from unipar.plan.representation import Mesh


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _all_partitions(n, parts, allowed_cuts=None):
    cut_points = range(1, n) if allowed_cuts is None else allowed_cuts
    for cuts in itertools.combinations(cut_points, parts - 1):
        bounds = [0, *cuts, n]
        yield [list(range(bounds[i], bounds[i + 1])) for i in range(parts)]


def _every_plan(profile, devices_per_node, devices, batch, heads):
    """The space, written out independently: tp within a node dividing the heads, with
    sequence parallelism when tp > 1; pp up to the number of blocks; dp all-reduce or
    with a distributed optimizer (ZeRO-1), or fsdp with ZeRO-2 or ZeRO-3; every
    microbatch size; GPipe, 1F1B (m >= pp), interleaved (v = 2, 3, 4, 6 or 8, m a
    multiple of pp); recompute none, or full of every 4th, 2nd or every layer (no
    attention core is told apart here, so selective recompute and context parallelism
    do not apply)."""
    for tp, pp in itertools.product(_divisors(devices_per_node), _divisors(devices)):
        if heads % tp or devices % (tp * pp) or pp > profile.num_blocks:
            continue
        replicas = devices // (tp * pp)
        if batch % replicas:
            continue
        flavours = [(replicas, 1, True, False)] + (
            [(replicas, 1, True, True), (1, replicas, False, False), (1, replicas, True, False)]
            if replicas > 1
            else []
        )
        recomputes = [(Recompute.NONE, 1)] + [(Recompute.FULL, n) for n in (4, 2, 1)]
        for (dp, fsdp, reshard, zero1), b, (recompute, every) in itertools.product(
            flavours, _divisors(batch // replicas), recomputes
        ):
            m = batch // replicas // b
            schedules = (
                [(PipelineSchedule.ONE_F_ONE_B, 1)]
                if pp == 1
                else [
                    (PipelineSchedule.GPIPE, 1),
                    *([(PipelineSchedule.ONE_F_ONE_B, 1)] if m >= pp else []),
                    *[
                        (PipelineSchedule.INTERLEAVED_1F1B, v)
                        for v in (2, 3, 4, 6, 8)
                        if pp * v <= profile.num_blocks and m % pp == 0
                    ],
                ]
            )
            for schedule, v in schedules:
                yield Plan(
                    mesh=Mesh(pp=pp, dp=dp, fsdp=fsdp, tp=tp),
                    microbatch_size=b,
                    num_microbatches=m,
                    schedule=schedule,
                    virtual_stages=v,
                    recompute=recompute,
                    recompute_every=every,
                    reshard_after_forward=reshard,
                    sequence_parallel=tp > 1,
                    distributed_optimizer=zero1,
                )


@pytest.mark.parametrize(
    ("hidden", "layers", "heads", "seq", "devices", "batch", "memory_gib", "memory_binds"),
    [
        (1024, 6, 16, 1024, 4, 8, 80, False),  # memory is no object
        (2048, 6, 16, 2048, 4, 8, 9, True),  # memory rules plans out
    ],
)
def test_search_matches_brute_force(
    hidden, layers, heads, seq, devices, batch, memory_gib, memory_binds
):
    config = GPTConfig(vocab_size=8192, seq_len=seq, hidden=hidden, layers=layers, heads=heads)
    spec = config.spec()
    profile = analyze(
        spec.factory, spec.sample_shape, hidden=hidden, tp_divisibility=spec.tp_divisibility
    )
    base = cluster_preset("a100-80g", nodes=1, devices_per_node=devices)
    from dataclasses import replace

    cluster = replace(base, device=replace(base.device, memory_gib=memory_gib))
    model = CostModel(profile, cluster)
    best_time, count, over_memory = float("inf"), 0, 0
    # Stages start at a block (never at the first: the embeddings stay with it).
    block_starts = [i for i, x in enumerate(profile.layers) if x.kind is LayerKind.BLOCK][1:]
    count_plans = 0
    for plan in _every_plan(profile, devices, devices, batch, heads):
        count_plans += 1
        for stages in _all_partitions(
            len(profile.layers), plan.mesh.pp * plan.virtual_stages, block_starts
        ):
            estimate = model.estimate(plan, stages)
            count += 1
            if estimate.fits:
                best_time = min(best_time, estimate.step_time_s)
            else:
                over_memory += 1
    found = search(profile, cluster, batch)
    assert count > found.evaluated  # brute force saw every partition too
    assert found.best.estimate.step_time_s == pytest.approx(best_time, rel=1e-12)
    # The search rejects plans for memory exactly when some plan is over memory.
    assert (over_memory > 0) is memory_binds
    assert bool(found.rejected) is memory_binds
    # The search skips only options slower than one that fits (more recompute).
    assert found.evaluated <= count_plans


def test_balanced_partition_is_optimal():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        weights = [rng.uniform(0.1, 5) for _ in range(n)]
        parts = rng.randint(1, n)
        got = balanced_partition(weights, parts)
        assert [i for run in got for i in run] == list(range(n))
        best = min(
            max(sum(weights[i] for i in run) for run in p) for p in _all_partitions(n, parts)
        )
        assert max(sum(weights[i] for i in run) for run in got) == pytest.approx(best)
