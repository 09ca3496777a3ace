"""Plans re-derived for another number of workers (pure), and bad elastic settings."""

from __future__ import annotations

import pytest

from unipar import ConfigError, ResourceError, fit
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan
from unipar.plan.representation import Mesh
from unipar.plan.resize import resize_plan, sizes_that_work
from unipar.runtime.config import parse_workers
from unipar.testing import tiny_mlp_job


def test_data_parallel_keeps_the_micro_batch_and_the_global_batch():
    plan = Plan.data_parallel(2, 8)
    one = resize_plan(plan, 1)
    assert (one.mesh.dp, one.microbatch_size, one.num_microbatches) == (1, 4, 2)
    four = resize_plan(plan, 4)
    assert (four.mesh.dp, four.microbatch_size, four.num_microbatches) == (4, 2, 1)
    for size in (1, 2, 4, 8):
        assert resize_plan(plan, size).global_batch_size == 8
    assert resize_plan(plan, 3) is None
    assert sizes_that_work(plan, 1, 8) == [1, 2, 4, 8]


def test_sharded_plan_scales_its_fsdp_axis():
    plan = Plan(mesh=Mesh(dp=2, fsdp=2), microbatch_size=2)
    assert resize_plan(plan, 8).mesh == Mesh(dp=2, fsdp=4)
    assert resize_plan(plan, 2).mesh == Mesh(dp=2, fsdp=1)


def test_pipeline_collapses_to_fewer_stages_when_the_size_needs_it():
    plan = Plan(mesh=Mesh(pp=4), microbatch_size=1, num_microbatches=8, stage_boundaries=(1, 2, 3))
    two = resize_plan(plan, 2)
    assert two.mesh == Mesh(pp=2) and two.stage_boundaries == (2,)
    one = resize_plan(plan, 1)
    assert one.mesh == Mesh() and one.stage_boundaries == ()
    assert resize_plan(plan, 8).mesh == Mesh(pp=4, dp=2)


def test_tensor_parallel_is_dropped_only_when_the_size_is_not_a_multiple_of_it():
    plan = Plan(mesh=Mesh(tp=2, dp=2), microbatch_size=6, sequence_parallel=True)
    assert resize_plan(plan, 6).mesh == Mesh(tp=2, dp=3)
    three = resize_plan(plan, 3)
    assert three.mesh == Mesh(dp=3) and not three.sequence_parallel
    assert three.global_batch_size == plan.global_batch_size == 12


def test_least_workers_above_most_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"min=3 and max=2.*workers=\(2, 3\)"):
        fit(tiny_mlp_job(), workers=(3, 2), run_dir=tmp_path)


def test_plan_that_cannot_reshard_to_the_least_size_names_the_sizes_that_work(tmp_path):
    with pytest.raises(UnsupportedPlanError, match=r"to 3 workers.*sizes that work: 1, 2, 4, 8"):
        fit(tiny_mlp_job(), workers=(3, 4), plan=Plan.data_parallel(4, 8), run_dir=tmp_path)


def test_least_workers_above_the_cluster_is_refused(ray_cluster, tmp_path):
    with pytest.raises(ResourceError, match=r"needs 6 CPUs \(6 workers x 1 CPU each\).*has 4"):
        fit(tiny_mlp_job(global_batch_size=24), workers=(6, 8), run_dir=tmp_path)


def test_cliparse_workers():
    assert parse_workers("4") == 4
    assert parse_workers("2:8") == (2, 8)
    with pytest.raises(Exception, match="MIN:MAX"):
        parse_workers("two")
