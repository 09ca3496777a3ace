"""The host's time per op on an eager GPU: a small model's step is the host's (the demo
GPT on an H100 ran 12 ms a step where its kernels were priced at 2.5 ms), a large
model's is its kernels', and the per-op correction learned from runs scales it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from unipar.analysis import analyze
from unipar.cluster import cluster_preset
from unipar.cluster.corrections import Rate, corrected
from unipar.cluster.run_records import fingerprint
from unipar.cluster.spec import EAGER_HOST_OP_S, OPTIMIZER_HOST_OPS_PER_TENSOR
from unipar.models.gpt import GPTConfig
from unipar.plan import Plan, Recompute
from unipar.plan.predict import estimate_plan, seconds_by_rate

DEMO = GPTConfig(vocab_size=256, seq_len=128, hidden=128, layers=4, heads=4)  # gpt-stdlib
GPU_CHECK = GPTConfig(vocab_size=8192, seq_len=512, hidden=1024, layers=8, heads=16)
PLAN = Plan.data_parallel(1, 32)


def _profile(config: GPTConfig):
    spec = config.spec()
    return analyze(
        spec.factory, spec.sample_shape, hidden=spec.hidden, attention_seq=spec.attention_seq
    )


def _without_host(cluster):
    return replace(cluster, device=replace(cluster.device, host_op_s=0.0))


@pytest.fixture(scope="module")
def eager_h100():
    return cluster_preset("h100-80g", devices_per_node=1).as_trained_by_unipar()


def test_a_small_models_step_is_the_hosts(eager_h100):
    profile = _profile(DEMO)
    ops = sum(layer.matmul_ops + layer.memory_ops for layer in profile.layers)
    tensors = sum(layer.param_tensors for layer in profile.layers)
    time = estimate_plan(profile, PLAN, eager_h100).time
    assert time.compute_s == pytest.approx(3 * ops * EAGER_HOST_OP_S)
    per_tensor = OPTIMIZER_HOST_OPS_PER_TENSOR * EAGER_HOST_OP_S
    assert time.optimizer_s == pytest.approx(tensors * per_tensor)
    kernels_only = _without_host(eager_h100)
    assert estimate_plan(profile, PLAN, kernels_only).time.compute_s < time.compute_s / 3
    # the step is the per-op group's: what runs on this cluster teach about it scales it
    step, shares = seconds_by_rate(profile, PLAN, eager_h100)
    assert dict(shares)[Rate.PER_OP] > 0.99 * step
    faster_host = corrected(eager_h100, {Rate.PER_OP: 2.0}, runs=1)
    assert estimate_plan(profile, PLAN, faster_host).step_time_s == pytest.approx(step / 2)


def test_a_large_models_step_is_its_kernels(eager_h100):
    """gpu_check's 118M GPT: the host issues a block's ops in ~2 ms, its kernels take
    ~30: compute as without the host's time but for the few ops of the embeddings and
    the last norm (under 0.1%); the optimizer floor stays below the measured optimizer
    step (4.3 ms on the H100)."""
    profile = _profile(GPU_CHECK)
    kernels_only = _without_host(eager_h100)
    time = estimate_plan(profile, PLAN, eager_h100).time
    kernels = estimate_plan(profile, PLAN, kernels_only).time.compute_s
    assert kernels < time.compute_s < 1.001 * kernels
    assert time.optimizer_s < 4.3e-3


def test_cpu_workers_and_fused_presets_have_no_host_floor():
    assert cluster_preset("h100-80g").device.host_op_s == 0.0
    assert cluster_preset("cpu").device.host_op_s == 0.0


def test_selective_recompute_issues_its_ops_again(eager_h100):
    """On a host-bound GPU the ops run again cost the host again: selective recompute's
    attention core, the op-level policy's products and memory-bound ops."""
    profile = _profile(DEMO)

    def compute(recompute):
        plan = replace(PLAN, recompute=recompute)
        return estimate_plan(profile, plan, eager_h100).time.compute_s

    none = compute(Recompute.NONE)
    assert none < compute(Recompute.SELECTIVE) < compute(Recompute.SELECTIVE_OP)
    assert compute(Recompute.FULL) == pytest.approx(none * 4 / 3)


def test_records_made_before_the_host_floor_keep_their_cluster():
    """The field is left out of the fingerprint where zero: the keys of a CPU preset and
    a fused GPU preset are those they had before it (their runs still correct them); an
    eager GPU's is new (its earlier runs were split without the floor)."""
    assert fingerprint(cluster_preset("cpu")).key == "82fdd50c729c3d1b"
    assert fingerprint(cluster_preset("h100-80g", devices_per_node=8)).key == "5a395012b85b2149"
    eager = cluster_preset("h100-80g", devices_per_node=1).as_trained_by_unipar()
    assert fingerprint(eager).key != fingerprint(_without_host(eager)).key
