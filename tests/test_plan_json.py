"""Plans and plan reports are plain data that round-trip through JSON."""

from __future__ import annotations

import json

import pytest

from unipar import ConfigError
from unipar.cluster import cluster_preset
from unipar.models import LlamaConfig
from unipar.plan import Mesh, PipelineSchedule, Plan, Recompute, plan


@pytest.mark.parametrize(
    "original",
    [
        Plan(),
        Plan.data_parallel(4, 32, microbatch_size=2),
        Plan(
            mesh=Mesh(pp=4, dp=2, fsdp=2, tp=2),
            microbatch_size=2,
            num_microbatches=8,
            schedule=PipelineSchedule.INTERLEAVED_1F1B,
            virtual_stages=2,
            recompute=Recompute.FULL,
            reshard_after_forward=False,
            stage_boundaries=(3, 6, 9, 12, 15, 18, 21),
        ),
    ],
)
def test_plan_round_trips(original):
    text = original.to_json()
    assert Plan.from_json(text) == original
    assert Plan.from_json(json.dumps(json.loads(text))) == original


def test_every_searched_plan_round_trips():
    report = plan(LlamaConfig(layers=4).spec(), cluster_preset("h100-80g", nodes=2), 64)
    for candidate in report.result.ranked + report.result.rejected:
        assert Plan.from_json(candidate.plan.to_json()) == candidate.plan
    assert json.loads(json.dumps(report.to_dict()))["full_plan"] == report.best.plan.to_dict()
    assert "chosen:" in report.explain() and "next best" in report.explain()


MINIMAL = {"mesh": {"dp": 2}, "microbatch_size": 4, "num_microbatches": 1}


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"meshes": {}}, r"unknown plan fields \['meshes'\]"),
        ({"schedule": "zigzag"}, r"schedule must be one of 'gpipe', '1f1b'"),
        ({"mesh": {"tp": 0}}, "mesh axis tp must be >= 1, but got 0"),
        ({"mesh": {"tp": "2"}}, "mesh axis tp must be a whole number"),
        ({"mesh": {"xp": 2}}, r"mesh must be an object with axes among \['pp', 'dp'"),
        ({"mesh": [2]}, "mesh must be an object"),
        ({"microbatch_size": "4"}, "plan field microbatch_size must be a whole number"),
        ({"num_microbatches": 0}, "plan field num_microbatches must be >= 1"),
        ({"virtual_stages": 0}, "plan field virtual_stages must be >= 1"),
        ({"recompute": "some"}, "recompute must be one of 'none', 'selective', 'selective_op'"),
        ({"reshard_after_forward": "yes"}, "reshard_after_forward must be True or False"),
        ({"layer_tp": ["diagonal"]}, "layer_tp must be one of 'replicate'"),
        ({"layer_tp": "megatron"}, "layer_tp must be a list"),
        ({"mesh": {"pp": 2}, "stage_boundaries": [3, 5]}, r"stages 1\.\.1 \(pp=2 x"),
        ({"mesh": {"pp": 2}, "stage_boundaries": [0]}, "increasing and >= 1, but got \\[0\\]"),
        ({"mesh": {"pp": 3}, "stage_boundaries": [4, 2]}, "increasing"),
    ],
)
def test_bad_plan_json_names_the_field(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Plan.from_dict({**MINIMAL, **changes})


def test_plan_json_parse_errors_give_line_and_column():
    text = '{\n  "mesh": {"dp": 2},\n  "microbatch_size": 4,\n}'
    with pytest.raises(ConfigError, match=r"plan.json is not valid JSON: .* line 4, column 1"):
        Plan.from_json(text, source="plan.json")


def test_missing_plan_fields_are_named():
    with pytest.raises(ConfigError, match=r"plan fields \['microbatch_size', 'num_microbatches'\]"):
        Plan.from_dict({"mesh": {"dp": 2}})
    with pytest.raises(ConfigError, match="a plan must be a JSON object"):
        Plan.from_json("[1, 2]")


def test_plan_report_json_is_a_plan():
    """What `unipar plan --json` prints is what `unipar train --strategy` reads."""
    import contextlib
    import io

    from unipar.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["plan", "gpt", "--layers", "2", "--global-batch", "16", "--json"])
    report = json.loads(out.getvalue())
    parsed = Plan.from_json(out.getvalue())
    assert parsed.to_dict() == report["full_plan"]
    assert (parsed.mesh.tp, parsed.mesh.pp, parsed.mesh.dp) == tuple(
        report["plan"][k] for k in ("tp", "pp", "dp")
    )


def test_mesh_coordinates_put_tp_innermost():
    from unipar.plan import Mesh

    mesh = Mesh(pp=2, dp=1, fsdp=2, tp=2)
    seen = {mesh.coordinates(rank) for rank in range(8)}
    assert len(seen) == 8
    assert [mesh.coordinates(r).tp for r in range(4)] == [0, 1, 0, 1]
    assert mesh.coordinates(5) == type(mesh.coordinates(0))(pp=1, dp=0, fsdp=0, tp=1)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"mesh": Mesh(fsdp=2), "distributed_optimizer": True}, "distributed optimizer"),
        ({"mesh": Mesh(cp=2, fsdp=2), "microbatch_size": 4}, "context parallelism with fsdp"),
    ],
)
def test_fit_refuses_plans_the_runtime_cannot_apply(changes, pattern):
    """Planned options the runtime lacks are refused before anything starts, not run as
    something else."""
    from dataclasses import replace

    from unipar.plan.runtime_support import check_plan_for_run

    runnable = Plan.data_parallel(2, 8)
    check_plan_for_run(runnable, 2, 8)
    check_plan_for_run(replace(runnable, distributed_optimizer=True), 2, 8)  # ZeRO-1 over dp
    check_plan_for_run(replace(runnable, mesh=Mesh(cp=2), microbatch_size=8), 2, 8)  # cp alone
    refused = replace(runnable, **changes)
    with pytest.raises(ConfigError, match=pattern):
        check_plan_for_run(refused, refused.mesh.world_size, 8)
