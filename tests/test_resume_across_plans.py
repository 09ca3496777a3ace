"""A checkpoint written under one plan resumes under another: DCP reshards the model
and the optimizer state (kept per parameter name) to the new mesh and worker count,
and training goes on exactly as if it had never stopped."""

from __future__ import annotations

import sys

import pytest
import ray
import torch
from plans_for_tests import planned
from reference_loop import single_process_losses

from unipar import fit, load_model_state
from unipar.runtime.checkpoint import checkpoint_name
from unipar.testing import tiny_gpt_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CASES = {
    "dp2-to-tp2": ((2, {"dp": 2}), (2, {"tp": 2})),
    "pp2-to-fsdp2xtp2": ((2, {"pp": 2, "microbatch_size": 2}), (4, {"fsdp": 2, "tp": 2})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_under_another_plan(ray_cluster, tmp_path, case):
    (workers_a, pinned_a), (workers_b, pinned_b) = CASES[case]
    job = tiny_gpt_job(steps=10)
    expected_losses, expected_weights = single_process_losses(job)

    first = fit(
        job,
        workers=workers_a,
        plan=planned(job, workers_a, **pinned_a),
        run_dir=tmp_path / "first",
        checkpoint_every=5,
        progress=False,
    )
    halfway = first.checkpoint_dir / checkpoint_name(5)
    assert halfway.is_dir()
    second = fit(
        job,
        workers=workers_b,
        plan=planned(job, workers_b, **pinned_b),
        run_dir=tmp_path / "second",
        resume=halfway,
        checkpoint_every=5,  # one checkpoint, at step 10: the final one read back below
        progress=False,
    )

    assert [m.step for m in second.history] == list(range(5, 10))
    torch.testing.assert_close(second.losses, expected_losses[5:], rtol=1e-5, atol=0)
    final = load_model_state(second.final_checkpoint)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=1e-4, msg=name)
