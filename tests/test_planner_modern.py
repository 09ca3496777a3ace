"""The planner at modern scale: attention as the device runs it, sequence and context
parallelism, the distributed optimizer, selective and partial recompute, what the
runtime cannot apply yet, and plans of Hugging Face configs. Pure planning: no Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from unipar import ConfigError
from unipar.analysis import analyze
from unipar.cluster import AttentionKernel, Kernels, cluster_preset
from unipar.cluster.spec import EAGER_SLOWDOWN
from unipar.models import LlamaConfig, llama3_8b, llama3_405b
from unipar.models.hf_config import hf_spec
from unipar.plan import Constraints, Mesh, Plan, Recompute, plan, search
from unipar.plan.collectives import Collective, ring_time
from unipar.plan.cost import CostModel
from unipar.plan.explain import trades
from unipar.plan.presets import constraints_for
from unipar.plan.representation import MeshAxis, Strategy
from unipar.plan.runtime_support import Feature, plan_features, unsupported_features

CONFIGS = Path(__file__).resolve().parent / "hf_configs"
LLAMA_405B = llama3_405b(seq_len=8192)
SMALL = LlamaConfig(vocab_size=1024, seq_len=512, hidden=512, layers=4, heads=8, kv_heads=2)


def _profile(config: LlamaConfig):
    spec = config.spec()
    return analyze(
        spec.factory,
        spec.sample_shape,
        hidden=spec.hidden,
        tp_divisibility=spec.tp_divisibility,
        attention_seq=spec.attention_seq,
    )


@pytest.fixture(scope="module")
def small():
    return _profile(SMALL)


def _estimate(profile, cluster, plan_):
    chunks = plan_.mesh.pp * plan_.virtual_stages
    n = len(profile.layers)
    stages = [list(range(n))] if chunks == 1 else None
    assert stages is not None
    return CostModel(profile, cluster).estimate(plan_, stages)


@pytest.mark.parametrize("attention", ["flash", "math"])
def test_selective_op_costs_between_none_and_full(small, attention):
    """torchtitan's op-level recompute runs half the products and the element-wise ops
    again: more time than none, less than full; it keeps less than none and more than
    full (a block's input only)."""
    cluster = cluster_preset("h100-80g", attention=attention)
    none, op_level, full = (
        _estimate(small, cluster, Plan(recompute=r))
        for r in (Recompute.NONE, Recompute.SELECTIVE_OP, Recompute.FULL)
    )
    assert none.step_time_s < op_level.step_time_s < full.step_time_s
    assert full.memory.activations_gib < op_level.memory.activations_gib
    assert op_level.memory.activations_gib < none.memory.activations_gib


def test_attention_core_is_told_apart(small):
    block = small.layers[1]
    s, h, heads, kv = SMALL.seq_len, SMALL.hidden, SMALL.heads, SMALL.kv_heads
    assert block.attention_flops == 4 * s * s * h  # q @ k^T and p @ v, 2 FLOPs per MAC
    assert block.attention_saved_elems >= heads * s * s  # the softmax output at least
    # Grouped-query keys and values counted as projected, not as repeated per head.
    assert block.attention_kv_elems == 2 * s * kv * (h // heads)
    assert small.causal_attention and small.attention_seq == s


def test_flash_stores_no_scores_and_runs_half_the_causal_products(small):
    math_cluster = cluster_preset("a100-80g", attention="math", devices_per_node=1)
    flash_cluster = cluster_preset("a100-80g", attention="flash", devices_per_node=1)
    one = Plan(microbatch_size=2)
    math, flash = (_estimate(small, c, one) for c in (math_cluster, flash_cluster))
    scores = sum(x.attention_saved_elems for x in small.layers) * 2 * 2 / 2**30
    assert math.memory.activations_gib - flash.memory.activations_gib == pytest.approx(scores)
    assert flash.time.compute_s < math.time.compute_s
    # The model's FLOPs (as MFU counts them) do not depend on the kernel.
    assert flash.model_flops == math.model_flops


def test_selective_recompute_stores_no_scores_and_runs_the_core_again(small):
    cluster = cluster_preset("a100-80g", attention="math", devices_per_node=1)
    none = _estimate(small, cluster, Plan(microbatch_size=2))
    selective = _estimate(small, cluster, Plan(microbatch_size=2, recompute=Recompute.SELECTIVE))
    full = _estimate(small, cluster, Plan(microbatch_size=2, recompute=Recompute.FULL))
    assert full.memory.activations_gib < selective.memory.activations_gib
    assert selective.memory.activations_gib < none.memory.activations_gib
    assert none.time.compute_s < selective.time.compute_s < full.time.compute_s


def test_recompute_every_nth_layer_lies_between_none_and_full(small):
    cluster = cluster_preset("a100-80g", devices_per_node=1)
    results = [
        _estimate(small, cluster, Plan(microbatch_size=2, recompute=r, recompute_every=n))
        for r, n in ((Recompute.NONE, 1), (Recompute.FULL, 2), (Recompute.FULL, 1))
    ]
    memory = [e.memory.activations_gib for e in results]
    time = [e.time.compute_s for e in results]
    assert memory[0] > memory[1] > memory[2]
    assert time[0] < time[1] < time[2]
    assert time[1] - time[0] == pytest.approx((time[2] - time[0]) / 2)


def test_sequence_parallel_divides_full_width_activations_at_equal_communication(small):
    cluster = cluster_preset("a100-80g", devices_per_node=4)
    base = Plan(mesh=Mesh(tp=4), microbatch_size=2)
    off = _estimate(small, cluster, base)
    on = _estimate(small, cluster, replace(base, sequence_parallel=True))
    replicated = sum(x.saved_elems_replicated for x in small.layers) * 2 * 2 / 2**30
    saved = off.memory.activations_gib - on.memory.activations_gib
    assert saved == pytest.approx(replicated * (1 - 1 / 4))  # Korthikanti et al., Sec. 4.2
    assert on.time.tp_comm_s == off.time.tp_comm_s  # reduce-scatter + all-gather
    assert on.time.compute_s < off.time.compute_s


def test_distributed_optimizer_shards_optimizer_state_over_data_parallel_ranks(small):
    cluster = cluster_preset("a100-80g", devices_per_node=4)
    ddp = Plan(mesh=Mesh(dp=4), microbatch_size=2)
    plain = _estimate(small, cluster, ddp)
    zero1 = _estimate(small, cluster, replace(ddp, distributed_optimizer=True))
    assert zero1.memory.optimizer_gib == pytest.approx(plain.memory.optimizer_gib / 4)
    assert zero1.memory.weights_gib == plain.memory.weights_gib
    assert zero1.memory.gradients_gib == plain.memory.gradients_gib
    assert zero1.time.optimizer_s == pytest.approx(plain.time.optimizer_s / 4)


def test_context_parallel_splits_sequences_and_passes_keys_and_values(small):
    cluster = cluster_preset("h100-80g", devices_per_node=2)
    one = _estimate(small, cluster, Plan(microbatch_size=2))
    two = _estimate(small, cluster, Plan(mesh=Mesh(cp=2), microbatch_size=2))
    assert two.memory.activations_gib == pytest.approx(one.memory.activations_gib / 2)
    assert two.time.compute_s < one.time.compute_s
    assert two.memory.weights_gib == one.memory.weights_gib  # cp ranks hold all weights
    with pytest.raises(ConfigError, match="2 x cp divides the sequence"):
        search(small, cluster_preset("h100-80g", nodes=64), 64, Constraints(cp=512))


def test_all_gather_over_nodes_pays_a_latency_per_rank():
    cluster = cluster_preset("h100-80g", nodes=256)
    gather = Collective.ALL_GATHER
    small_group = ring_time(1e6, Mesh(fsdp=256, tp=8), MeshAxis.FSDP, cluster, collective=gather)
    wide_group = ring_time(1e6, Mesh(fsdp=2048), MeshAxis.FSDP, cluster, collective=gather)
    latency = cluster.inter_node.latency_s
    assert wide_group > 2047 * latency  # one ring over every rank
    assert small_group < 256 * latency + 1e6 / (cluster.inter_node.bandwidth / 8)


def test_runtime_support_names_every_new_option():
    assert unsupported_features(Plan()) == []
    everything = Plan(
        mesh=Mesh(cp=2, tp=2, dp=2),
        sequence_parallel=True,
        distributed_optimizer=True,
        recompute=Recompute.FULL,
        recompute_every=2,
    )
    assert plan_features(everything) == set(Feature) - {
        Feature.SELECTIVE_RECOMPUTE,
        Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER,
    }
    zero1 = Plan(mesh=Mesh(dp=4), distributed_optimizer=True)
    assert plan_features(zero1) == {Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER}
    assert unsupported_features(zero1) == []  # the runtime applies it over dp alone
    messages = unsupported_features(everything, lacking=frozenset(Feature))
    assert len(messages) == 5 and all("runtime cannot apply" in m for m in messages)
    selective = Plan(recompute=Recompute.SELECTIVE)
    assert "recompute 'none' or 'full'" in unsupported_features(selective, frozenset(Feature))[0]
    assert unsupported_features(selective) == []  # the runtime applies it (parity tests)


def test_live_planning_proposes_only_what_the_runtime_runs():
    cluster = cluster_preset("a100-80g", nodes=2, attention="math")
    spec = SMALL.spec()
    free = plan(spec, cluster, 64, keep=500)
    live = plan(spec, cluster, 64, constraints=constraints_for(Strategy.AUTO, 16), keep=500)
    assert any(plan_features(c.plan) for c in free.result.ranked)
    assert all(not unsupported_features(c.plan) for c in live.result.ranked + live.result.rejected)
    assert constraints_for(Strategy.FSDP, 16).runtime_only


def test_new_plan_fields_round_trip_and_old_plans_still_load():
    new = Plan(
        mesh=Mesh(pp=2, tp=2, cp=2, dp=2),
        sequence_parallel=True,
        distributed_optimizer=True,
        recompute=Recompute.FULL,
        recompute_every=2,
    )
    assert Plan.from_json(new.to_json()) == new
    old = json.loads(Plan(mesh=Mesh(dp=2)).to_json())
    for key in ("sequence_parallel", "distributed_optimizer", "recompute_every"):
        old.pop(key)
    old["mesh"].pop("cp")
    assert Plan.from_dict(old) == Plan(mesh=Mesh(dp=2))
    assert Mesh(dp=2, cp=2, tp=2).coordinates(5).cp == 0
    assert Mesh(dp=2, cp=2, tp=2).coordinates(3).cp == 1


def test_405b_on_8192_h100_the_published_plan_fits_and_free_search_is_no_slower():
    cluster = cluster_preset("h100-80g", nodes=1024)
    spec = LLAMA_405B.spec()
    published = plan(spec, cluster, 2048, constraints=Constraints(tp=8, pp=16, dp=64, cp=1))
    assert published.best.estimate.fits
    free = plan(spec, cluster, 2048)
    assert free.best.estimate.step_time_s <= published.best.estimate.step_time_s
    if free.best.plan != published.best.plan:
        text = trades(free.best, published.best, "the published plan")
        assert "versus the published plan tp=8 pp=16 dp=64" in text
        assert " s" in text.split("time (chosen - other): ")[1]
        assert "GiB" in text.split("memory (chosen - other): ")[1]


def _plan_command(config: str) -> list[str]:
    return [
        "plan",
        f"hf:{CONFIGS / config}.json",
        "--seq",
        "1024",
        "--cluster",
        "h100-80g",
        "--nodes",
        "2",
        "--global-batch",
        "64",
        "--json",
    ]


@pytest.mark.parametrize(
    ("config", "params_b"),
    [("llama3_8b", 8.03), ("qwen2_7b", 7.62), ("mistral_7b", 7.24), ("gpt2", 0.124)],
)
def test_plan_hf_configs(config, params_b, capsys):
    """``unipar plan hf:...`` on real configs (the CLI's own entry point, in process)."""
    from unipar.cli.main import main

    assert main(_plan_command(config)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["params"] / 1e9 == pytest.approx(params_b, abs=0.01)
    assert result["predicted"]["step_time_s"] > 0
    assert (
        result["plan"]["tp"]
        * result["plan"]["pp"]
        * result["plan"]["cp"]
        * (result["plan"]["dp"] * result["plan"]["fsdp"])
        == 16
    )


def test_plan_hf_config_from_a_fresh_process():
    command = [sys.executable, "-m", "unipar", *_plan_command("qwen2_7b")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout)["model"]["params"] / 1e9 == pytest.approx(7.62, abs=0.01)


def test_hf_config_errors_name_the_rule(tmp_path):
    with pytest.raises(ConfigError, match="model_type must be one of"):
        hf_spec({"model_type": "bert"}, seq_len=128)
    with pytest.raises(ConfigError, match="no Hugging Face config"):
        hf_spec(tmp_path / "missing.json", seq_len=128)
    with pytest.raises(ConfigError, match="seq_len must be at most"):
        hf_spec(CONFIGS / "gpt2.json", seq_len=4096)


def test_hf_llama_costs_what_the_reference_llama_costs():
    """The same architecture through transformers and through unipar's Llama."""
    hf = hf_spec(CONFIGS / "llama3_8b.json", seq_len=256)
    ours = llama3_8b(seq_len=256).spec()
    a, b = (
        analyze(s.factory, s.sample_shape, hidden=s.hidden, attention_seq=256) for s in (hf, ours)
    )
    assert a.params == b.params
    assert a.forward_flops == pytest.approx(b.forward_flops, rel=1e-3)
    assert a.layers[1].attention_flops == b.layers[1].attention_flops


def test_eager_kernels_cost_torchtitans_eager_to_compiled_ratio(small):
    """Eager kernels scale compute (not communication) by torchtitan's eager vs
    compiled figure; a bad value is refused with the choices."""
    fused = cluster_preset("h100-80g")
    eager = cluster_preset("h100-80g", kernels="eager")
    assert eager.device.kernels is Kernels.EAGER and fused.device.kernels is Kernels.FUSED
    plan_ = Plan(mesh=Mesh(fsdp=8), recompute=Recompute.SELECTIVE_OP)
    times = [_estimate(small, c, plan_).time for c in (fused, eager)]
    assert times[1].compute_s == pytest.approx(times[0].compute_s * EAGER_SLOWDOWN)
    assert times[1].grad_sync_s == pytest.approx(times[0].grad_sync_s)
    with pytest.raises(ConfigError, match="kernels must be one of"):
        cluster_preset("h100-80g", kernels="compiled")


def test_eager_share_in_float32_scales_with_bytes_and_peak(small):
    """Eager's extra share, measured in bf16, is memory traffic: in float32 on an H100
    it is (EAGER_SLOWDOWN - 1) x 2 bytes-ratio x 67/989 peak-ratio, not the bf16 share
    (the H100's measured step sat 16.7% under the bf16 share's prediction)."""
    trained = cluster_preset("h100-80g").as_trained_by_unipar()
    # the host's time per op apart (a small model is host-bound: test_host_floor_*)
    trained = replace(trained, device=replace(trained.device, host_op_s=0.0))
    fused = replace(trained, device=replace(trained.device, kernels=Kernels.FUSED))
    plan_ = Plan(mesh=Mesh(fsdp=8))
    eager_s, fused_s = (_estimate(small, c, plan_).time.compute_s for c in (trained, fused))
    share = (EAGER_SLOWDOWN - 1) * 2 * 67e12 / 989e12
    assert eager_s == pytest.approx(fused_s * (1 + share))
    assert 0.02 < share < 0.03


def test_cluster_attention_override():
    assert cluster_preset("h100-80g").device.attention is AttentionKernel.FLASH
    assert cluster_preset("h100-80g", attention="math").device.attention is AttentionKernel.MATH
    with pytest.raises(ConfigError, match="attention must be one of"):
        cluster_preset("h100-80g", attention="fast")


@pytest.mark.parametrize(
    ("config", "seq", "why"),
    [
        ("gpt2", 1024, "the config's positions"),
        ("llama3.1_405b", 8192, "the config's positions, capped at 8192"),
    ],
)
def test_plan_hf_config_defaults_to_its_own_sequence_length(config, seq, why, capsys):
    """Without --seq, an HF config is planned at its own positions (GPT-2: 1024; a
    128k-position config at the cap), and the output says so."""
    from unipar.cli.main import main

    nodes = "1" if config == "gpt2" else "32"
    command = ["plan", f"hf:{CONFIGS / config}.json", "--cluster", "h100-80g", "--nodes",
               nodes, "--global-batch", "1024"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sequence length {seq}: {why} (--seq sets another)\n")
    assert "chosen:" in out
