"""Parity: tiny random-initialised Hugging Face models (Llama, Qwen2 with tied word
embeddings, GPT-2 with its tied head, Conv1D and fused c_attn) train under every kind
of plan to the single-process losses and weights. Llama's job has the user's own loss,
reading ``out.logits``: under pp the last stage hands it the model's own
``ModelOutput``, as every other plan does. A user's module calling GPT-2 by keyword
(``self.gpt(input_ids=x)``) trains under pp.

Each plan comes from the planner with its mesh pinned; the runtime applies it on Ray
workers. Three steps per case keep the 18 cases small.

Tolerances, float32, as in test_parity_plans: relative 1e-5 per step's loss (sums
are taken in another order); absolute 1e-4 on the final weights read back from the
plan's own checkpoint (Adam divides rounding noise by an almost-zero second moment
where a gradient is almost zero).
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("transformers")

import hf_models
import ray
import torch
from hf_models import hf_job
from plans_for_tests import planned
from reference_loop import assert_trained_like, single_process_losses

from unipar import fit, load_model_state
from unipar.plan import PipelineSchedule

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(hf_models)

RTOL, ATOL_WEIGHTS, STEPS = 1e-5, 1e-4, 3
GPIPE, ONE_F_ONE_B = PipelineSchedule.GPIPE, PipelineSchedule.ONE_F_ONE_B

TWO_WORKER_PLANS = {
    "dp2": {"dp": 2},
    "fsdp2": {"fsdp": 2},
    "tp2": {"tp": 2},
    "pp2-gpipe": {"pp": 2, "microbatch_size": 2, "schedule": GPIPE},
    "pp2-1f1b": {"pp": 2, "microbatch_size": 2, "schedule": ONE_F_ONE_B},
}
TWO_D_PLANS = {  # one per family, 4 workers
    "llama": ("fsdp2xtp2", {"fsdp": 2, "tp": 2}),
    "qwen2": ("pp2xfsdp2", {"pp": 2, "fsdp": 2, "microbatch_size": 2}),
    "gpt2": ("pp2xtp2", {"pp": 2, "tp": 2, "microbatch_size": 2, "schedule": ONE_F_ONE_B}),
}
CASES = {
    f"{family}-{name}": (family, 2, pins)
    for family in hf_models.FAMILIES
    for name, pins in TWO_WORKER_PLANS.items()
} | {f"{family}-{name}": (family, 4, pins) for family, (name, pins) in TWO_D_PLANS.items()}
for family in ("llama", "gpt2"):
    CASES[f"{family}-tp2-sequence-parallel"] = (family, 2, {"tp": 2, "sequence_parallel": True})
CASES["gpt2-in-user-model-pp2-gpipe"] = ("gpt2-in-user-model", 2, TWO_WORKER_PLANS["pp2-gpipe"])


@pytest.mark.parametrize("case", list(CASES))
def test_hf_plan_matches_single_process(ray_cluster, tmp_path, case):
    family, workers, pinned = CASES[case]
    job = hf_job(family, steps=STEPS)
    plan = planned(job, workers, **pinned)
    for axis in ("dp", "fsdp", "tp", "pp"):
        assert getattr(plan.mesh, axis) == pinned.get(axis, 1)
    expected_losses, expected_weights = single_process_losses(job)
    # one checkpoint, the final one read back below (the default is one a step)
    result = fit(job, workers=workers, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=STEPS)

    assert result.plan == plan
    assert [m.step for m in result.history] == list(range(STEPS))
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    final = load_model_state(result.final_checkpoint)
    assert_trained_like(job, final, expected_weights, atol=ATOL_WEIGHTS, moved=5e-4)
