"""The heterogeneous cluster spec and planner, without Ray."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from unipar.cluster.hetero import (
    hetero_cluster_from_nodes,
    hetero_cluster_from_yaml,
    parse_hetero_cluster,
)
from unipar.cluster.spec import PRESETS, Kernels, Precision
from unipar.errors import ConfigError, ResourceError
from unipar.plan.hetero import (
    HeteroKind,
    HeteroPlan,
    plan_hetero,
    predict_data_parallel,
    transformer_layers,
    water_fill,
)

GPT_350M = transformer_layers(hidden=1024, layers=24, seq_len=1024, vocab=50257)
LLAMA_7B = transformer_layers(hidden=4096, layers=32, seq_len=2048, vocab=32000)


def test_cluster_string_makes_groups_with_their_devices():
    cluster = parse_hetero_cluster("4xa100-80g+8xv100-16g")
    assert [g.count for g in cluster.groups] == [4, 8]
    assert [g.device.name for g in cluster.groups] == ["A100-SXM4-80GB", "V100-SXM2-16GB"]
    assert cluster.num_devices == 12
    # the slower group's network joins the groups
    assert cluster.link_between_groups == cluster.groups[1].inter_node
    assert parse_hetero_cluster("16xa100-80g/4").groups[0].cluster.nodes == 4


def test_yaml_form_with_price_and_links():
    cluster = hetero_cluster_from_yaml(
        """
groups:
  - {device: a100-80g, nodes: 2, devices_per_node: 4, price_per_device_hour: 4.1}
  - {device: v100-16g, count: 8, inter_node_gbps: 1.25}
"""
    )
    assert [g.count for g in cluster.groups] == [8, 8]
    assert cluster.groups[0].cluster.nodes == 2
    assert cluster.price_per_hour == pytest.approx(8 * 4.1)
    assert cluster.groups[1].inter_node.bandwidth == 1.25e9


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("4xa100-80g+8xb200", "'b200'"),  # unknown device
        ("4xa100-80g+eight-v100", "'eight-v100'"),  # not COUNTxDEVICE
        ("6xa100-80g/4", "'6xa100-80g/4'"),  # 6 devices are not whole nodes of 4
    ],
)
def test_bad_cluster_strings_name_the_part(text, named):
    with pytest.raises(ConfigError, match=named):
        parse_hetero_cluster(text)


def test_inconsistent_node_counts_in_yaml_name_the_group():
    with pytest.raises(ConfigError, match=r"groups\[1\].*nodes=2 x devices_per_node=4 != count=6"):
        hetero_cluster_from_yaml(
            "groups: [{device: a100-80g, count: 4}, "
            "{device: v100-16g, nodes: 2, devices_per_node: 4, count: 6}]"
        )


def test_group_too_small_for_the_model_is_named():
    big = transformer_layers(hidden=12288, layers=96, seq_len=2048, vocab=50257)  # GPT-3 175B
    with pytest.raises(ResourceError, match=r"group '0:v100-16g' \(2x V100-SXM2-16GB\)"):
        plan_hetero(big, parse_hetero_cluster("2xv100-16g"), 8, microbatch_sizes=(1,))


def test_data_parallel_shares_follow_speed_and_cover_the_batch():
    cluster = parse_hetero_cluster("4xh100-80g+4xa100-80g")
    plan = plan_hetero(GPT_350M, cluster, 64, kinds=(HeteroKind.DATA_PARALLEL,))
    assert sum(plan.replica_samples) == 64
    by_group = {a.group: a for a in plan.assignments}
    h100, a100 = by_group["0:h100-80g"], by_group["1:a100-80g"]
    assert sum(h100.microbatches) / h100.replicas > sum(a100.microbatches) / a100.replicas
    even = predict_data_parallel(
        GPT_350M, cluster, ((2,) * 4, (2,) * 4), 4
    )  # 8 samples per replica in micro-batches of 4
    assert plan.predicted_step_s < even


def test_pipeline_gives_faster_groups_more_layers_and_tp_stays_in_a_group():
    cluster = parse_hetero_cluster("8xa100-80g+8xv100-16g")
    plan = plan_hetero(LLAMA_7B, cluster, 64)
    assert plan.kind is HeteroKind.PIPELINE  # a 7B replica does not fit a V100
    by_device = {a.device: a for a in plan.assignments}
    a100, v100 = by_device["A100-SXM4-80GB"], by_device["V100-SXM2-16GB"]
    assert a100.end_layer - a100.first_layer > v100.end_layer - v100.first_layer
    for a in plan.assignments:
        assert 8 % a.tp == 0 and a.tp * a.replicas == a.devices  # TP within one node
    assert sorted(a.end_layer - a.first_layer for a in plan.assignments)[0] >= 1
    assert sum(a.end_layer - a.first_layer for a in plan.assignments) == len(LLAMA_7B)


def test_plan_round_trips_through_json():
    for kind in HeteroKind:
        plan = plan_hetero(
            GPT_350M, parse_hetero_cluster("4xa100-80g+8xv100-16g"), 32, kinds=(kind,)
        )
        assert HeteroPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ConfigError, match="not a heterogeneous plan"):
        HeteroPlan.from_dict({"kind": "ring"})


def test_water_fill_minimises_the_slowest_replica():
    step, per = water_fill([1.0, 2.0], [1, 2], 8)
    assert per[0] + 2 * per[1] >= 8
    assert step == pytest.approx(4.0, rel=1e-6)  # 4 on the fast one, 2 on each slow one


def test_search_scales_to_1000_devices_of_3_types():
    """Bound, not absolute time: 1,000 devices of 3 types cost at most a few times 30
    devices of the same 3 types (the search is over tp degrees and micro-batch sizes,
    with water-filling and a bisection per candidate, not over devices)."""

    def timed(text: str) -> float:
        began = time.process_time()
        plan_hetero(GPT_350M, parse_hetero_cluster(text), 1024)
        return time.process_time() - began

    small = timed("8xa100-80g+16xv100-16g+8xh100-80g")
    large = timed("400xa100-80g+400xv100-16g+200xh100-80g")
    assert large < 5 * small + 0.5


def test_ray_node_types_become_groups():
    nodes = [
        {"CPU": 96, "GPU": 8, "accelerator_type:A100": 1},
        {"CPU": 96, "GPU": 8, "accelerator_type:A100": 1},
        {"CPU": 64, "GPU": 8, "accelerator_type:V100": 1},
        {"CPU": 16},  # a CPU-only head node: not a training device here
    ]
    cluster = hetero_cluster_from_nodes(nodes)
    assert [(g.device.name, g.cluster.nodes, g.count) for g in cluster.groups] == [
        ("A100-SXM4-80GB", 2, 16),
        ("V100-SXM2-16GB", 1, 8),
    ]
    with pytest.raises(ConfigError, match="'MI300X'"):
        hetero_cluster_from_nodes([{"GPU": 8, "accelerator_type:MI300X": 1}])
    # priced as unipar's runtime trains on them: float32, eager (not the presets' bf16)
    assert {(g.device.precision, g.device.kernels) for g in cluster.groups} == {
        (Precision.FP32, Kernels.EAGER)
    }


def test_a_gpu_preset_as_unipar_trains_runs_at_its_fp32_rate():
    """On one H100 the bf16 preset predicted 0.027 s a step of a 118M GPT that ran 0.247
    s in float32 (benchmarks/gpu_check.py): the runtime's cluster prices float32."""
    preset = PRESETS["h100-80g"]
    trained = preset.as_trained_by_unipar()
    assert (trained.device.precision, trained.device.kernels) == (Precision.FP32, Kernels.EAGER)
    assert trained.device.peak_flops == preset.device.peak_flops_32bit
    assert preset.device.precision is Precision.BF16  # the published runs' preset unchanged
    assert trained.resized(2, 4).device == trained.device


def test_cli_plans_a_mixed_cluster():
    command = [sys.executable, "-m", "unipar", "plan", "gpt", "--global-batch", "32"]
    out = subprocess.run(
        [*command, "--cluster", "4xa100-80g+8xv100-16g", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    plan = HeteroPlan.from_json(out.stdout)
    assert {a.group for a in plan.assignments} == {"0:a100-80g", "1:v100-16g"}
    bad = subprocess.run(
        [*command, "--cluster", "4xa100-80g+8xb200"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "unknown device 'b200'" in bad.stderr
