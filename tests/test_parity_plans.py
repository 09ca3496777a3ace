"""Parity: every kind of plan trains the small models to the single-process losses.

Each plan comes from the planner with its mesh (and where it matters its micro-batch
size, schedule and recompute) pinned; the runtime applies it on Ray workers with
FSDP2, DTensor tensor parallel and ``torch.distributed.pipelining``.

Tolerances, float32: relative 1e-5 per step's loss (measured: at most 2.3e-7; sums are
taken in another order, so they differ by rounding). Absolute 1e-4 on the final
weights, read back from the plan's own checkpoint: where a gradient is almost zero,
Adam divides rounding noise by its almost-zero second moment (measured: up to 2.5e-5
on a few elements under fsdp x tp after two steps, 1e-7 typical).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import ray
import torch
from plans_for_tests import planned
from reference_loop import single_process_losses

from unipar import Job, fit, load_model_state
from unipar.models.gpt import GPTConfig
from unipar.plan import PipelineSchedule, Recompute
from unipar.testing import tiny_gpt_job, tiny_llama_job, tiny_mlp_job, user_model_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RTOL = 1e-5
GPIPE, ONE_F_ONE_B = PipelineSchedule.GPIPE, PipelineSchedule.ONE_F_ONE_B
FOUR_LAYERS = GPTConfig(vocab_size=64, seq_len=16, hidden=32, layers=4, heads=2)


def gpt() -> Job:
    return tiny_gpt_job(steps=10)


def gpt_four_layers() -> Job:
    return tiny_gpt_job(steps=10, config=FOUR_LAYERS)


def gpt_four_heads() -> Job:
    return tiny_gpt_job(steps=10, config=replace(FOUR_LAYERS, heads=4))


CASES = {
    # name: (job factory, workers, pinned choices)
    "fsdp2-accumulate": (gpt, 2, {"fsdp": 2, "microbatch_size": 2}),
    "tp2": (gpt, 2, {"tp": 2, "microbatch_size": 4}),
    "pp2-gpipe": (gpt, 2, {"pp": 2, "microbatch_size": 2, "schedule": GPIPE}),
    "pp2-1f1b-recompute": (
        gpt,
        2,
        {"pp": 2, "microbatch_size": 2, "schedule": ONE_F_ONE_B, "recompute": Recompute.FULL},
    ),
    "pp2-interleaved": (
        gpt_four_layers,
        2,
        {"pp": 2, "microbatch_size": 2, "schedule": PipelineSchedule.INTERLEAVED_1F1B},
    ),
    "dp2xtp2": (gpt, 4, {"dp": 2, "tp": 2}),
    "fsdp2xtp2-recompute": (gpt, 4, {"fsdp": 2, "tp": 2, "recompute": Recompute.FULL}),
    "pp2xdp2": (gpt, 4, {"pp": 2, "dp": 2, "microbatch_size": 2}),
    "pp2xtp2": (gpt, 4, {"pp": 2, "tp": 2, "microbatch_size": 2, "schedule": GPIPE}),
    "fsdp4": (gpt, 4, {"fsdp": 4}),
    "tp4": (gpt_four_heads, 4, {"tp": 4}),
    "pp4-1f1b": (gpt_four_layers, 4, {"pp": 4, "microbatch_size": 2, "schedule": ONE_F_ONE_B}),
    "fsdp2-selective-recompute": (gpt, 2, {"fsdp": 2, "recompute": Recompute.SELECTIVE}),
    "tp2-selective-recompute": (gpt, 2, {"tp": 2, "recompute": Recompute.SELECTIVE}),
    "fsdp2-selective-op-recompute": (gpt, 2, {"fsdp": 2, "recompute": Recompute.SELECTIVE_OP}),
    "dp2-recompute-every-2nd": (
        gpt_four_layers,
        2,
        {"dp": 2, "recompute": Recompute.FULL, "recompute_every": 2},
    ),
    # (one distributed-optimizer case: runtime/parallel/distributed_optimizer.py has no
    # branch on the number of ranks but for one rank, so 4 ranks run what 2 would)
    "dp4-distributed-optimizer": (gpt, 4, {"dp": 4, "distributed_optimizer": True}),
    "tp2-sequence-parallel": (gpt, 2, {"tp": 2, "sequence_parallel": True}),
    "llama-tp2-sequence-parallel": (tiny_llama_job, 2, {"tp": 2, "sequence_parallel": True}),
    "llama-tp2": (tiny_llama_job, 2, {"tp": 2}),
    "llama-pp2": (tiny_llama_job, 2, {"pp": 2, "microbatch_size": 2}),
    "mlp-fsdp2": (tiny_mlp_job, 2, {"fsdp": 2}),
    "user-model-pp2": (user_model_job, 2, {"pp": 2, "microbatch_size": 2}),
    "user-model-tp2": (user_model_job, 2, {"tp": 2}),
    "cp2": (gpt, 2, {"cp": 2}),
    "llama-cp2": (tiny_llama_job, 2, {"cp": 2}),
    "dp2xcp2": (gpt, 4, {"dp": 2, "cp": 2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_matches_single_process(ray_cluster, tmp_path, case):
    make_job, workers, pinned = CASES[case]
    job = make_job()
    plan = planned(job, workers, **pinned)
    for axis in ("dp", "fsdp", "tp", "pp", "cp"):
        assert getattr(plan.mesh, axis) == pinned.get(axis, 1)
    expected_losses, expected_weights = single_process_losses(job)
    # one checkpoint, the final one read back below (the default, one a step here, cost
    # about a third of each case's time: a DCP save per step)
    result = fit(job, workers=workers, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)

    assert result.plan == plan
    assert [m.step for m in result.history] == list(range(10))
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    final = load_model_state(result.final_checkpoint)
    assert set(final) == set(expected_weights)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=1e-4, msg=name)
    torch.manual_seed(job.seed)
    initial = job.model().state_dict()
    moved = max((final[k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 5e-3  # ten optimizer steps really happened
