"""``--strategy auto`` on Hugging Face models: the planner's choice runs and trains to
the single-process losses; a run that fails at its start leaves no run directory."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("transformers")

import hf_models
import ray
import torch
from hf_models import hf_job
from reference_loop import single_process_losses

from unipar import UserCodeError, fit
from unipar.testing import tiny_gpt_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(hf_models)


@pytest.mark.parametrize("family", list(hf_models.FAMILIES))
def test_auto_picks_a_plan_and_runs_it(ray_cluster, tmp_path, family):
    job = hf_job(family, steps=2)
    result = fit(job, workers=2, plan="auto", run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)  # one checkpoint, not one a step: none is read
    assert result.explanation
    assert result.plan.mesh.world_size == 2
    expected, _ = single_process_losses(job)
    torch.testing.assert_close(result.losses, expected, rtol=1e-5, atol=0)


def test_failed_start_leaves_no_run_directory(ray_cluster, tmp_path):
    run_dir = tmp_path / "runs" / "failing"
    with pytest.raises(UserCodeError, match="failed on purpose"):
        fit(tiny_gpt_job(steps=2, failing_model=True), workers=2, run_dir=run_dir, progress=False)
    assert not (tmp_path / "runs").exists()
