"""Parity of heterogeneous plans: uneven data-parallel shares and uneven pipeline stages,
made by the heterogeneous planner for a mixed cluster, train the small GPT to the
single-process losses.

Tolerances, float32: relative 1e-5 per step's loss and absolute 1e-4 on the final
weights, as tests/test_parity_plans.py (sums over replicas are taken in another order,
so losses differ by rounding only).
"""

from __future__ import annotations

import sys

import ray
import torch
from reference_loop import single_process_losses

from unipar import fit, load_model_state
from unipar.cluster.hetero import parse_hetero_cluster
from unipar.plan import Mesh, Plan
from unipar.plan.hetero import HeteroKind, LayerProfile, plan_hetero, transformer_layers
from unipar.runtime.uneven_dp import train_uneven
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


def test_uneven_data_parallel_shares_match_single_process(ray_cluster):
    job = tiny_gpt_job(steps=6)
    plan = plan_hetero(
        _tiny_gpt_layers(),
        parse_hetero_cluster(CLUSTER),
        job.global_batch_size,
        kinds=(HeteroKind.DATA_PARALLEL,),
        microbatch_sizes=(1,),
    )
    samples = plan.replica_samples
    assert len(samples) == 2 and samples[0] > samples[1] > 0  # the A100 takes more
    expected_losses, expected_weights = single_process_losses(job)
    result = train_uneven(job, samples, plan.microbatch_size)
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(result.state[name], tensor, rtol=0, atol=ATOL, msg=name)


def test_uneven_pipeline_stages_match_single_process(ray_cluster, tmp_path):
    job = tiny_gpt_job(steps=6)
    layers = _tiny_gpt_layers()
    hetero = plan_hetero(
        layers,
        parse_hetero_cluster(CLUSTER),
        job.global_batch_size,
        kinds=(HeteroKind.PIPELINE,),
        microbatch_sizes=(2,),
    )
    sizes = [a.end_layer - a.first_layer for a in sorted(hetero.assignments, key=lambda a: a.stage)]
    assert len(sizes) == 2 and sizes[0] != sizes[1], sizes  # uneven stages
    plan = Plan(
        mesh=Mesh(pp=2),
        microbatch_size=hetero.microbatch_size,
        num_microbatches=hetero.num_microbatches,
        stage_boundaries=hetero.stage_boundaries,
    )
    expected_losses, expected_weights = single_process_losses(job)
    result = fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False)
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    final = load_model_state(result.final_checkpoint)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=ATOL, msg=name)
