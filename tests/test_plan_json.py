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


def test_bad_plan_json_names_the_field():
    with pytest.raises(ConfigError, match=r"unknown plan fields \['meshes'\]"):
        Plan.from_dict({"meshes": {}})
    with pytest.raises(ConfigError, match=r"schedule must be one of 'gpipe', '1f1b'"):
        Plan.from_dict({"schedule": "zigzag"})
    with pytest.raises(ConfigError, match="mesh axis tp must be an int >= 1, but got 0"):
        Plan.from_dict({"mesh": {"tp": 0}})


def test_mesh_coordinates_put_tp_innermost():
    from unipar.plan import Mesh

    mesh = Mesh(pp=2, dp=1, fsdp=2, tp=2)
    seen = {mesh.coordinates(rank) for rank in range(8)}
    assert len(seen) == 8
    assert [mesh.coordinates(r).tp for r in range(4)] == [0, 1, 0, 1]
    assert mesh.coordinates(5) == type(mesh.coordinates(0))(pp=1, dp=0, fsdp=0, tp=1)
