"""The placed 3D step-time model (unipar.plan.placed): shared node networks, the
pipeline formula, and AMP's published trials, where it must do at least as well as
AMP's own cost model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from unipar.cluster.spec import LinkSpec
from unipar.errors import ConfigError
from unipar.plan.hetero import LayerProfile
from unipar.plan.placed import Placed3DPlan, PlacedNode, predict_placed

NET = LinkSpec(bandwidth=1e9, latency_s=0.0)
NODE = PlacedNode("n", 2, 1e12, 1e12, LinkSpec(bandwidth=1e11, latency_s=0.0), NET)
LAYER = LayerProfile(flops=1e10, params=1e6, activation_bytes=0, output_bytes=1e6)


def _plan(tp: int, dp: int, pp: int, mb: int = 1, gbs: int | None = None) -> Placed3DPlan:
    starts = (*range(pp), 4)
    return Placed3DPlan(gbs or dp * mb, mb, tp, dp, pp, starts)


def test_data_parallel_groups_leaving_a_node_share_its_network():
    layers, ars = (LAYER,) * 4, (0,) * 4
    # tp=1, dp=4 on two nodes: one ring crosses each network once.
    one = predict_placed(layers, ars, (NODE, NODE), _plan(1, 4, 1)).data_parallel_s
    assert one == pytest.approx(2 * 3 / 4 * 4e6 * 4 / NET.bandwidth)
    # tp=2, dp=2: two rings (one per tensor shard) of half the bytes, both through each
    # node's network: 2 * (2 * 1/2 * 2e6 * 4) bytes.
    two = predict_placed(layers, ars, (NODE, NODE), _plan(2, 2, 1)).data_parallel_s
    assert two == pytest.approx(2 * (2 * 1 / 2 * 2e6 * 4) / NET.bandwidth)


def test_pipeline_adds_the_slowest_stage_per_extra_microbatch():
    layers, ars = (LAYER,) * 4, (0,) * 4
    nodes = (NODE, NODE)
    one = predict_placed(layers, ars, nodes, _plan(1, 1, 4, gbs=1)).pipeline_s
    three = predict_placed(layers, ars, nodes, _plan(1, 1, 4, gbs=3)).pipeline_s
    stage = LAYER.flops / NODE.flops
    # stages 0, 1 on node 0 and 2, 3 on node 1: two boundaries inside a node, one across;
    # each sends the activation forward and its gradient back.
    inside, across = 2 * 1e6 / NODE.intra.bandwidth, 2 * 1e6 / NET.bandwidth
    assert one == pytest.approx(4 * stage + 2 * inside + across)
    # stages 1 and 2 are the slowest: their compute and the transfers on both sides.
    assert three - one == pytest.approx(2 * (stage + inside + across))


def test_bad_placed_plans_name_the_rule():
    with pytest.raises(ConfigError, match=r"tp\*dp\*pp = devices"):
        predict_placed((LAYER,) * 4, (0,) * 4, (NODE, NODE), _plan(1, 2, 1))
    with pytest.raises(ConfigError, match="stage_starts"):
        predict_placed((LAYER,) * 4, (0,) * 4, (NODE, NODE), Placed3DPlan(4, 1, 1, 4, 1, (0, 3)))


def test_at_least_as_good_as_amp_on_its_published_trials(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "amp_comparison.py"
    spec = importlib.util.spec_from_file_location("amp_comparison", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    result = capsys.readouterr().out.strip().splitlines()[-1]
    figures = dict(part.split("=") for part in result.split()[1:])
    ours_err, amp_err = float(figures["ours_median_err"]), float(figures["amp_median_err"])
    assert ours_err <= amp_err, result
    assert float(figures["ours_spearman"]) >= float(figures["amp_spearman"]), result
