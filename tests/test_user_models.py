"""Parity for the models and batches people write (``user_models``), on 2 workers,
under the plans each was refused or broke under before:

- a BERT classifier on dict batches (``input_ids``, ``attention_mask``; ``model(**inputs)``)
  under ddp, fsdp, tp (Megatron's split of BERT's attention and MLP, embeddings
  replicated), pp (pooler and classifier on the last stage, the mask read on every
  stage) and ``auto``;
- an ``nn.Sequential`` CNN on scikit-learn's digits, cut between layers under pp, and
  ``auto``;
- a user's classifier taking the dict batch as one argument, its forward a loop over a
  list of layers each given the mask, under pp;
- ``auto`` on a user's module calling a Hugging Face model by keyword
  (``self.gpt(input_ids=x)``), whose pp runs in test_hf_parity.

The Hugging Face causal LM with the user's loss reading ``out.logits`` is test_hf_parity's
Llama (every plan, pp GPipe and 1F1B included) and test_hf_auto's (``auto``): its job has
that loss, so no run here repeats one there. Each run is a gang of 2 worker processes
started anew (the cost of a case: ~10 s of CPU, ~25-40 s on 2 shared cores at load 7), so
the cases are the fewest that cover the table in docs/models.md.

Each plan comes from the planner with its mesh pinned (auto: the planner's choice on
the session's cluster). Three steps per run.

Tolerances, float32, as in test_hf_parity: relative 1e-5 per step's loss (sums taken
in another order); absolute 1e-4 on the final weights read back from the run's own
checkpoint.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sklearn")

import hf_models
import ray
import torch
import user_models
from plans_for_tests import planned
from reference_loop import assert_trained_like, single_process_losses

from unipar import fit, load_model_state
from unipar.plan import PipelineSchedule

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(hf_models)
ray.cloudpickle.register_pickle_by_value(user_models)

RTOL, ATOL_WEIGHTS = 1e-5, 1e-4
PLANS = {
    "dp2": {"dp": 2},
    "fsdp2": {"fsdp": 2},
    "tp2": {"tp": 2},
    "pp2-gpipe": {"pp": 2, "microbatch_size": 2, "schedule": PipelineSchedule.GPIPE},
    "pp2-1f1b": {"pp": 2, "microbatch_size": 2, "schedule": PipelineSchedule.ONE_F_ONE_B},
    "auto": None,
}
RUNS = {
    "gpt2-in-user-model": ["auto"],
    "bert-classifier": ["dp2", "fsdp2", "tp2", "pp2-1f1b", "auto"],
    "sequential-cnn": ["pp2-gpipe", "auto"],
    "dict-classifier": ["pp2-1f1b"],
}
CASES = [(job, plan) for job, plans in RUNS.items() for plan in plans]


@pytest.mark.parametrize(("name", "plan_name"), CASES, ids=[f"{j}-{p}" for j, p in CASES])
def test_user_model_matches_single_process(ray_cluster, tmp_path, name, plan_name):
    job = user_models.JOBS[name]()
    pinned = PLANS[plan_name]
    plan = "auto" if pinned is None else planned(job, 2, **pinned)
    expected_losses, expected_weights = single_process_losses(job)
    # one checkpoint, the final one read back below (the default is one a step here)
    result = fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)

    if pinned is not None:
        assert result.plan == plan
    assert result.plan.mesh.world_size == 2
    torch.testing.assert_close(result.losses, expected_losses, rtol=RTOL, atol=0)
    final = load_model_state(result.final_checkpoint)
    assert_trained_like(job, final, expected_weights, atol=ATOL_WEIGHTS, moved=5e-4)
