"""The cost model prices what the runtime and its collective library do (pure, no Ray;
about 3 s of CPU, most of it analysing the small GPT once).

- gloo's reduce-scatter is an all-reduce of the whole input;
- the runtime's distributed optimizer over dp alone is DDP's all-reduce plus one
  broadcast per parameter from its owner;
- FSDP syncs on the last micro-batch only: what is per step does not grow with the
  micro-batches; its hooks are per parameter and micro-batch, its unsharding per unit
  and all-gather;
- a tensor-parallel block on CPU workers pays one collective per column-wise layer in
  backward (and, with sequence parallelism, the layouts' gathers and their calibrated
  framework time), a GPU Megatron's two per pass.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from unipar.analysis import analyze
from unipar.analysis.profile import LayerKind
from unipar.cluster.corrections import Rate, corrected
from unipar.cluster.spec import PRESETS, ClusterSpec, Collectives, DeviceSpec, LinkSpec, Precision
from unipar.models import GPT, GPTConfig
from unipar.plan import Mesh, Plan, Recompute, TensorParallelStyle
from unipar.plan.collectives import Collective, owner_broadcasts_time, ring_time
from unipar.plan.cost import CostModel, layer_time
from unipar.plan.fsdp_framework import CALIBRATION_TENSORS_PER_UNIT
from unipar.plan.representation import MeshAxis

CONFIG = GPTConfig(vocab_size=256, seq_len=64, hidden=64, layers=2, heads=2)
LINK = LinkSpec(bandwidth=1e9, latency_s=1e-4)


def _cpu(devices: int = 2, **device: float) -> ClusterSpec:
    """A gloo cluster of one-thread CPU workers, with the rates of the calibration's
    order of magnitude."""
    spec = DeviceSpec(
        name="cpu-thread",
        memory_gib=8.0,
        peak_flops_16bit=40e9,
        peak_flops_32bit=40e9,
        memory_bandwidth=2e9,
        gemm_efficiency=1.0,
        kernel_overhead_s=2e-5,
        reserved_gib=0.5,
        precision=Precision.FP32,
        overlaps_communication=False,
        collectives=Collectives.GLOO,
        **device,
    )
    return ClusterSpec("cpu", 1, devices, spec, LINK, LINK)


@pytest.fixture(scope="module")
def profile():
    spec = CONFIG.spec()
    return analyze(spec.factory, spec.sample_shape, hidden=spec.hidden)


def _time(profile, cluster, plan):
    return CostModel(profile, cluster).estimate(plan, [list(range(len(profile.layers)))]).time


def test_the_profile_counts_parameter_tensors_once(profile):
    model = GPT(CONFIG)
    assert sum(x.param_tensors for x in profile.layers) == len(list(model.parameters()))
    assert all(x.param_tensors > 0 for x in profile.layers if x.params > 0)


def test_gloo_reduce_scatter_costs_an_all_reduce_and_nccl_half():
    mesh, nbytes = Mesh(fsdp=2), 4e6
    gloo = _cpu()
    nccl = replace(gloo, device=replace(gloo.device, collectives=Collectives.NCCL))

    def t(cluster, kind):
        return ring_time(nbytes, mesh, MeshAxis.FSDP, cluster, collective=kind)

    reduce_scatter, all_reduce = Collective.REDUCE_SCATTER, Collective.ALL_REDUCE
    assert t(gloo, reduce_scatter) == t(gloo, all_reduce)
    assert t(nccl, reduce_scatter) == pytest.approx(t(nccl, all_reduce) / 2)
    assert t(gloo, Collective.ALL_GATHER) == t(nccl, Collective.ALL_GATHER)
    # one ring step of half the bytes, one latency
    assert t(gloo, Collective.ALL_GATHER) == pytest.approx(nbytes / 2 / 1e9 + 1e-4)


def test_owner_broadcasts_are_a_binomial_tree_under_gloo():
    mesh = Mesh(dp=4)
    gloo = _cpu(devices=4)
    seconds = owner_broadcasts_time(8e6, 50, mesh, MeshAxis.DP, gloo)
    assert seconds == pytest.approx(math.ceil(math.log2(4)) * (50 * 1e-4 + 8e6 / 1e9))
    assert owner_broadcasts_time(8e6, 50, Mesh(dp=1), MeshAxis.DP, gloo) == 0.0


def test_runtime_zero1_pays_ddp_all_reduce_and_the_broadcasts(profile):
    cluster = _cpu()
    ddp = Plan(mesh=Mesh(dp=2), microbatch_size=4, num_microbatches=2)
    zero1 = replace(ddp, distributed_optimizer=True)
    plain, sharded = _time(profile, cluster, ddp), _time(profile, cluster, zero1)
    grad_bytes = profile.params * 4
    tensors = sum(x.param_tensors for x in profile.layers)
    broadcasts = owner_broadcasts_time(grad_bytes, tensors, zero1.mesh, MeshAxis.DP, cluster)
    assert sharded.grad_sync_s == pytest.approx(plain.grad_sync_s + broadcasts)
    assert sharded.optimizer_s == pytest.approx(plain.optimizer_s / 2)
    # on this CPU the broadcasts cost more than the optimizer's halving saves
    assert sharded.total_s > plain.total_s


def test_megatron_zero1_with_other_axes_keeps_reduce_scatter_and_all_gather(profile):
    cluster = PRESETS["a100-80g"].resized(1, 4)
    ddp = Plan(mesh=Mesh(dp=2, tp=2), microbatch_size=2)
    zero1 = replace(ddp, distributed_optimizer=True)
    # under NCCL a reduce-scatter and an all-gather move what one all-reduce moves
    assert _time(profile, cluster, zero1).grad_sync_s == pytest.approx(
        _time(profile, cluster, ddp).grad_sync_s
    )


@pytest.mark.parametrize("reshard", [False, True])
def test_fsdp_per_step_terms_do_not_grow_with_micro_batches(profile, reshard):
    step_only = _cpu(fsdp_step_overhead_s=1e-3, fsdp_tensor_overhead_s=1e-4)
    hooks_only = _cpu(fsdp_unit_overhead_s=1e-4)
    bare = _cpu()
    one = Plan(mesh=Mesh(fsdp=2), microbatch_size=8, num_microbatches=1)
    one = replace(one, reshard_after_forward=reshard)
    four = replace(one, microbatch_size=2, num_microbatches=4)

    def framework(cluster, plan):
        return _time(profile, cluster, plan).grad_sync_s - _time(profile, bare, plan).grad_sync_s

    units = sum(x.kind is LayerKind.BLOCK for x in profile.layers) + 1  # + the root
    tensors = sum(x.param_tensors for x in profile.layers)
    assert framework(step_only, one) == pytest.approx(units * 1e-3 + tensors * 1e-4)
    assert framework(step_only, four) == pytest.approx(framework(step_only, one))
    assert framework(hooks_only, one) == pytest.approx(tensors * 3 * 1e-4)
    if reshard:  # ZeRO-3: every micro-batch unshards anew, per parameter
        assert framework(hooks_only, four) == pytest.approx(4 * framework(hooks_only, one))
    else:  # ZeRO-2: the 3 held micro-batches after the first run the hooks per unit
        held = 3 * units * CALIBRATION_TENSORS_PER_UNIT * 3 * 1e-4
        assert framework(hooks_only, four) == pytest.approx(framework(hooks_only, one) + held)
        assert units * CALIBRATION_TENSORS_PER_UNIT < tensors  # so held ones cost less
    # the collectives: ZeRO-2 gathers once a step, ZeRO-3 twice per micro-batch
    gathers = _time(profile, bare, four).grad_sync_s - _time(profile, bare, one).grad_sync_s
    assert (gathers > 0) is reshard
    # and so does the unsharding each all-gather costs the framework, per unit
    unshard = _cpu(fsdp_gather_overhead_s=1e-3)
    assert framework(unshard, one) == pytest.approx(units * (2 if reshard else 1) * 1e-3)
    assert framework(unshard, four) == pytest.approx(units * (8 if reshard else 1) * 1e-3)


def test_the_sharding_factor_scales_every_fsdp_rate_and_the_framework_factor_none():
    rates = {"fsdp_unit_overhead_s": 1e-4, "fsdp_step_overhead_s": 1e-3}
    cluster = _cpu(**rates, fsdp_tensor_overhead_s=2e-4, sharded_op_overhead_s=1e-3)
    cluster = replace(cluster, device=replace(cluster.device, fsdp_gather_overhead_s=4e-4))
    device = corrected(cluster, {Rate.SHARDING: 2.0}, runs=1).device
    assert (device.fsdp_unit_overhead_s, device.fsdp_step_overhead_s) == (5e-5, 5e-4)
    assert (device.fsdp_tensor_overhead_s, device.fsdp_gather_overhead_s) == (1e-4, 2e-4)
    assert device.sharded_op_overhead_s == 1e-3
    assert device.collectives is Collectives.GLOO
    # a slow tensor-parallel run's correction leaves FSDP's rates as calibrated
    tensor = corrected(cluster, {Rate.FRAMEWORK: 0.25}, runs=1).device
    assert tensor.sharded_op_overhead_s == 4e-3
    assert (tensor.fsdp_unit_overhead_s, tensor.fsdp_step_overhead_s) == (1e-4, 1e-3)



def _block(profile):
    return next(x for x in profile.layers if x.kind is LayerKind.BLOCK)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_block_on_cpu_workers_pays_each_collective_the_runtime_runs(profile, sequence_parallel):
    """The GPT's block has q, k, v and the MLP's input column-wise (4), the two output
    projections row-wise: the counts torch.profiler lists for the runtime's DTensor
    layers (plain tp: 2 all-reduces forward, 4 backward; sequence parallel: 5
    all-gathers and 2 reduce-scatters forward, 3 and 4 backward)."""
    block, cluster = _block(profile), _cpu()
    assert block.splittable_modules == 6
    plan = Plan(mesh=Mesh(tp=2), microbatch_size=2,
                sequence_parallel=sequence_parallel)
    output = block.output_elems * 2 * 4

    def ring(kind):
        return ring_time(output, plan.mesh, MeshAxis.TP, cluster, collective=kind)

    if sequence_parallel:
        expected = 8 * ring(Collective.ALL_GATHER) + 6 * ring(Collective.REDUCE_SCATTER)
    else:
        expected = 6 * ring(Collective.ALL_REDUCE)
    _, comm = layer_time(block, plan, cluster, style=TensorParallelStyle.MEGATRON)
    assert comm == pytest.approx(expected)
    # full recompute runs the forward's collectives again, not the backward's
    again = replace(plan, recompute=Recompute.FULL)
    _, recomputed = layer_time(block, again, cluster, style=TensorParallelStyle.MEGATRON)
    forward = 5 * ring(Collective.ALL_GATHER) + 2 * ring(Collective.REDUCE_SCATTER)
    assert recomputed - comm == pytest.approx(forward if sequence_parallel else 2 * ring(
        Collective.ALL_REDUCE))


def test_a_gpu_block_keeps_megatrons_two_collectives_per_pass(profile):
    block = _block(profile)
    cluster = PRESETS["a100-80g"].resized(1, 2)
    plan = Plan(mesh=Mesh(tp=2), microbatch_size=2, sequence_parallel=True)
    output = block.output_elems * 2 * cluster.device.bytes_per_element
    one = sum(
        ring_time(output, plan.mesh, MeshAxis.TP, cluster, collective=kind)
        for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
    )
    _, comm = layer_time(block, plan, cluster, style=TensorParallelStyle.MEGATRON)
    assert comm == pytest.approx(4 * one)


def test_sequence_parallel_layouts_cost_their_calibrated_time_per_split_module(profile):
    """Each split module pays ``sequence_parallel_op_overhead_s`` more per pass with
    sequence parallelism, and the framework factor scales it as the plain rate."""
    block = _block(profile)
    cluster = _cpu(sharded_op_overhead_s=1e-3, sequence_parallel_op_overhead_s=2e-3)
    plain = Plan(mesh=Mesh(tp=2), microbatch_size=2)
    sharded = replace(plain, sequence_parallel=True)

    def compute(cluster, plan):
        return layer_time(block, plan, cluster, style=TensorParallelStyle.MEGATRON)[0]

    without = replace(cluster, device=replace(cluster.device, sequence_parallel_op_overhead_s=0))
    assert compute(cluster, sharded) - compute(without, sharded) == pytest.approx(3 * 6 * 2e-3)
    assert compute(cluster, plain) == compute(without, plain)
    slower = corrected(cluster, {Rate.FRAMEWORK: 0.5}, runs=1)
    assert slower.device.sequence_parallel_op_overhead_s == pytest.approx(4e-3)


def test_the_optimizer_all_reduces_each_partial_gradient_sequence_parallelism_leaves(profile):
    """Under sequence parallelism a GPT block's norms (4 tensors) and row-wise biases
    (2) keep partial gradients, which AdamW's step all-reduces twice each."""
    cluster = _cpu()
    plain = Plan(mesh=Mesh(tp=2), microbatch_size=2, num_microbatches=2)
    sharded = replace(plain, sequence_parallel=True)
    tiny = ring_time(CONFIG.hidden * 4, plain.mesh, MeshAxis.TP, cluster,
                     collective=Collective.ALL_REDUCE)
    blocks = CONFIG.layers
    sync = {plan: _time(profile, cluster, plan).grad_sync_s for plan in (plain, sharded)}
    extra = sync[sharded] - sync[plain]
    assert extra == pytest.approx(2 * 6 * blocks * tiny)
    gpu = PRESETS["a100-80g"].resized(1, 2)
    assert _time(profile, gpu, sharded).grad_sync_s == _time(profile, gpu, plain).grad_sync_s
