"""Parity of heterogeneous plans: uneven data-parallel shares (a plan's
``replica_samples``) and uneven pipeline stages, made by the heterogeneous planner for a
mixed cluster, train the small GPT through ``fit`` to the single-process losses.

Tolerances, float32: relative 1e-5 per step's loss and absolute 1e-4 on the final
weights, as tests/test_parity_plans.py (sums over replicas are taken in another order,
so losses differ by rounding only).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import ray
import torch
from reference_loop import single_process_losses

from unipar import fit, load_model_state
from unipar.adapt import AdaptiveBatch
from unipar.cluster.hetero import parse_hetero_cluster
from unipar.errors import ConfigError
from unipar.plan import Mesh, Plan
from unipar.plan.hetero import HeteroKind, LayerProfile, plan_hetero, transformer_layers
from unipar.testing import tiny_gpt_config, tiny_gpt_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RTOL, ATOL = 1e-5, 1e-4
CLUSTER = "1xa100-80g+1xv100-16g"


def _tiny_gpt_layers() -> tuple[LayerProfile, ...]:
    """Profiles in the order of the runtime's layer sequence: token and position
    embeddings, the blocks, the final norm, the output head."""
    config = tiny_gpt_config(0.0)
    embed, *blocks, head = transformer_layers(
        hidden=config.hidden, layers=config.layers, seq_len=config.seq_len, vocab=config.vocab_size
    )
    free = LayerProfile(0.0, config.hidden, embed.output_bytes, embed.output_bytes)
    return (embed, free, *blocks, free, head)


def _hetero_plan(job, kind: HeteroKind, microbatch: int):  # type: ignore[no-untyped-def]
    """The heterogeneous planner's plan of ``kind`` for the tiny GPT on ``CLUSTER``."""
    return plan_hetero(
        _tiny_gpt_layers(),
        parse_hetero_cluster(CLUSTER),
        job.global_batch_size,
        kinds=(kind,),
        microbatch_sizes=(microbatch,),
    )


def _fit_matches_single_process(job, plan: Plan, run_dir) -> None:  # type: ignore[no-untyped-def]
    """``fit`` on 2 workers gives one process's losses and final weights."""
    expected_losses, expected_weights = single_process_losses(job)
    # one checkpoint, the final one read back below (the default is one a step here)
    result = fit(job, workers=2, plan=plan, run_dir=run_dir, progress=False,
                 checkpoint_every=job.steps)
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    final = load_model_state(result.final_checkpoint)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=ATOL, msg=name)


def test_uneven_pipeline_stages_match_single_process(ray_cluster, tmp_path):
    job = tiny_gpt_job(steps=6)
    hetero = _hetero_plan(job, HeteroKind.PIPELINE, 2)
    sizes = [a.end_layer - a.first_layer for a in sorted(hetero.assignments, key=lambda a: a.stage)]
    assert len(sizes) == 2 and sizes[0] != sizes[1], sizes  # uneven stages
    plan = hetero.to_plan()
    assert plan.mesh.pp == 2 and plan.stage_boundaries == hetero.stage_boundaries
    _fit_matches_single_process(job, plan, tmp_path)


def test_uneven_data_parallel_shares_through_fit_match_single_process(ray_cluster, tmp_path):
    job = tiny_gpt_job(steps=6)
    hetero = _hetero_plan(job, HeteroKind.DATA_PARALLEL, 1)
    plan = hetero.to_plan()
    # the A100 takes more
    assert plan.mesh.dp == 2 and plan.replica_samples[0] > plan.replica_samples[1] > 0
    assert Plan.from_json(plan.to_json()) == plan
    _fit_matches_single_process(job, plan, tmp_path)


def test_bad_uneven_shares_name_the_field():
    with pytest.raises(ConfigError, match="replica_samples must give each of the dp=2"):
        Plan(mesh=Mesh(dp=2), microbatch_size=2, num_microbatches=3, replica_samples=(6, 3))
    with pytest.raises(ConfigError, match=r"replica_samples .* needs plain data parallelism"):
        Plan(mesh=Mesh(dp=2, tp=2), microbatch_size=1, num_microbatches=3, replica_samples=(3, 1))


def test_uneven_shares_refuse_an_adaptive_batch(tmp_path):
    job = replace(tiny_gpt_job(steps=2), adaptive=AdaptiveBatch(max_global_batch=16))
    plan = Plan(mesh=Mesh(dp=2), microbatch_size=1, num_microbatches=6, replica_samples=(6, 2))
    with pytest.raises(ConfigError, match=r"adaptive batch .* replica_samples"):
        fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False)
