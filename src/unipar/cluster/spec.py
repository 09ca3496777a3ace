"""What a cluster offers the planner: devices, memory, compute rates and links.

Rates are the vendors' published peaks; achievable fractions are physical properties of
the hardware measured by others (cited per preset), not fitted to training runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from unipar.errors import ConfigError

GIB = 1024**3


class AttentionKernel(Enum):
    """How the device runs attention. ``math``: scores materialised (``seq x seq`` per
    head, stored for backward), as PyTorch's reference path and the meta-device
    analysis do. ``flash``: one fused kernel that keeps scores on chip, stores only
    the output and the softmax statistics, skips the masked half of causal scores and
    recomputes scores in backward (Dao et al. 2022; Dao 2023)."""

    MATH = "math"
    FLASH = "flash"


class Kernels(Enum):
    """How the training framework runs the model's ops. ``fused``: element-wise ops
    fused around the products (Megatron-LM's fused kernels, ``torch.compile``); the
    presets' rates are these (the cost model is checked against Megatron's SC'21
    runs). ``eager``: eager PyTorch, one kernel per op as the model's code calls them:
    compute takes :data:`EAGER_SLOWDOWN` times as long in bf16, less in a precision
    whose products are slower (:attr:`DeviceSpec.compute_slowdown`)."""

    FUSED = "fused"
    EAGER = "eager"


# torchtitan docs/performance.md (commit eaea6f6a), Table 1: Llama 3.1 8B, FSDP on 8
# H100, the same plan eager (5,762 tokens/s per GPU) and with torch.compile (6,667):
# what compiling (fusing) saves, the one published pair of the same run both ways.
EAGER_SLOWDOWN = 6667 / 5762

# Eager PyTorch on a GPU, the host's side: each op a pass calls costs the host about this
# long (Python, the dispatcher, autograd's record, the launch), and the GPU waits where
# its kernels are shorter. Measured on a lent H100 host (PyTorch 2.11, 2026-11-27,
# docs/planner-learning.md): the 0.88M-parameter demo GPT (101 ops a forward pass) took
# 2.9 ms a forward and 6.9 ms a backward in a plain loop (9.8 ms: 32 us per op and pass
# at the model's 1:2), 2.3 + 6.4 ms under unipar's runtime (29 us); a lone add took 13
# us, a linear layer with autograd 29 us, as a module 44 us.
# One host's figure, applied to every eager GPU preset (A100, V100, H200 as well): the
# host's time is its CPU's and PyTorch's, not the GPU's; runs on a cluster correct it
# (the per-op factor).
EAGER_HOST_OP_S = 30e-6
# The optimizer's host time per parameter tensor, in ops: foreach AdamW and the
# gradients' clipping, 1.24 ms for the demo GPT's 69 tensors (18 us each) in the same run:
# the least of the traced runs' 1.2-1.9 ms, as befits a floor.
OPTIMIZER_HOST_OPS_PER_TENSOR = 0.6


class Collectives(Enum):
    """The collective library the device's process groups run, where its algorithms
    differ from the ring the cost model assumes by default.

    ``nccl``: reduce-scatter and all-gather are rings moving (n-1)/n of the data per
    device, all-reduce one of each (Thakur et al. 2005; NCCL's ring algorithms).
    ``gloo``: PyTorch's gloo process group has no reduce-scatter of its own: it clones
    the input, all-reduces all of it and keeps its chunk
    (``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` in torch/csrc/distributed/
    c10d/ProcessGroupGloo.cpp), so a reduce-scatter costs a whole all-reduce; gloo's
    broadcast is a binomial tree of ceil(log2 n) rounds, each sending the whole tensor
    (``gloo::broadcast``, gloo/broadcast.cc)."""

    NCCL = "nccl"
    GLOO = "gloo"


class Precision(Enum):
    """Training precision of weights and activations."""

    BF16 = "bf16"
    FP32 = "fp32"

    @property
    def bytes(self) -> int:
        return 2 if self is Precision.BF16 else 4


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU worker).

    ``gemm_efficiency``: fraction of peak that large matrix products reach.
    ``kernel_overhead_s``: fixed cost of one operation (launch and tail), which makes
    small operations reach less of the peak: an op of ``f`` FLOPs takes
    ``f / (peak * gemm_efficiency) + kernel_overhead_s``.
    ``sharded_op_overhead_s`` and ``fsdp_unit_overhead_s``: the framework's own time
    per tensor-parallel linear layer and per parameter FSDP shards, per pass of each
    micro-batch, beyond arithmetic and collectives (DTensor dispatch, FSDP's hooks and
    its per-parameter bookkeeping); ``sequence_parallel_op_overhead_s``: what a
    tensor-parallel linear layer takes more per pass under sequence parallelism (the
    redistributions of its sequence-sharded layouts, DTensor's dispatch of the norms
    on sharded sequences). FSDP's own time
    once per optimizer step: ``fsdp_step_overhead_s`` per unit (its gradients copied
    into and out of the reduce-scatter's buffers) and ``fsdp_tensor_overhead_s`` per
    sharded parameter (the optimizer's step on DTensors, dispatched tensor by tensor);
    and ``fsdp_gather_overhead_s`` per unit and all-gather (unsharding it: storage,
    views, the copy out of the gathered buffer, and freeing it again), beyond the
    all-gather itself. Measured for CPU workers; zero for GPUs, where this host-side
    work runs ahead of the kernels and hides behind them.
    ``host_op_s``: the host's time per op and pass where the device runs eagerly and
    asynchronously (a GPU: :data:`EAGER_HOST_OP_S`): a layer's pass takes at least its
    ops times this, however short its kernels, and the optimizer step at least
    :data:`OPTIMIZER_HOST_OPS_PER_TENSOR` of it per parameter tensor. Zero where the
    host's time is the device's own (CPU workers: ``kernel_overhead_s`` holds it) or
    where kernels are fused and graphed (the presets' published runs).
    ``overlaps_communication``: whether gradient collectives run beside the backward
    (GPUs: copy engines and spare SMs) or take the cores it needs (one-thread CPU
    workers, where gloo reduces and copies on the same cores).
    ``reserved_gib``: memory the framework and runtime take before the model (context,
    communication buffers, allocator fragmentation).
    ``attention``: the attention kernel training uses on this device;
    ``attention_efficiency``: the fraction of peak a fused attention kernel reaches
    (``None``: ``gemm_efficiency``).
    ``kernels``: fused or eager execution (:class:`Kernels`).
    ``collectives``: the collective library (:class:`Collectives`).
    """

    name: str
    memory_gib: float
    peak_flops_16bit: float  # dense bf16/fp16 (tensor cores)
    peak_flops_32bit: float  # dense fp32
    memory_bandwidth: float  # bytes/s
    gemm_efficiency: float
    kernel_overhead_s: float
    reserved_gib: float
    precision: Precision = Precision.BF16
    sharded_op_overhead_s: float = 0.0
    sequence_parallel_op_overhead_s: float = 0.0
    fsdp_unit_overhead_s: float = 0.0
    fsdp_step_overhead_s: float = 0.0
    fsdp_tensor_overhead_s: float = 0.0
    fsdp_gather_overhead_s: float = 0.0
    optimizer_bandwidth: float | None = None  # bytes/s of the optimizer step (None: HBM)
    overlaps_communication: bool = True  # False: collectives take the cores compute needs
    attention: AttentionKernel = AttentionKernel.MATH
    attention_efficiency: float | None = None
    kernels: Kernels = Kernels.FUSED
    collectives: Collectives = Collectives.NCCL
    host_op_s: float = 0.0

    @property
    def compute_slowdown(self) -> float:
        """Compute time under the framework's kernels against the preset's rates.

        :data:`EAGER_SLOWDOWN` was measured in bf16. What fusing saves is memory
        traffic (the element-wise ops' reads and writes between kernels), so eager's
        extra time is a share of compute that grows with the bytes per element and
        shrinks as the products slow down: in another precision the extra share is
        ``(EAGER_SLOWDOWN - 1) * (bytes / 2) * (peak / peak_bf16)``. On an H100 in
        float32 without TF32 (67 against 989 TFLOP/s) that is 2.1% instead of 15.7%;
        measured there (``benchmarks/gpu_check.py``, docs/planner-learning.md), the
        118M GPT's step took 0.250 s where the bf16 share predicted 0.291 s."""
        if self.kernels is not Kernels.EAGER:
            return 1.0
        bytes_ratio = self.bytes_per_element / Precision.BF16.bytes
        speed_ratio = self.peak_flops / self.peak_flops_16bit
        return 1.0 + (EAGER_SLOWDOWN - 1.0) * bytes_ratio * speed_ratio

    @property
    def peak_flops(self) -> float:
        """Peak of the training precision."""
        return self.peak_flops_16bit if self.precision is Precision.BF16 else self.peak_flops_32bit

    @property
    def bytes_per_element(self) -> int:
        return self.precision.bytes


@dataclass(frozen=True)
class LinkSpec:
    """A link class: ``bandwidth`` in bytes/s one way, ``latency_s`` per message.

    Within a node the bandwidth is per device; across nodes it is the whole node's
    network bandwidth, shared by the node's devices.
    """

    bandwidth: float
    latency_s: float


@dataclass(frozen=True)
class ClusterSpec:
    """``machine``: for a cluster measured here (the calibrated CPU), the machine its
    calibration is keyed by (host and digest); ``""`` for a preset. ``corrections``:
    the factors learned from runs on this cluster, when applied
    (:mod:`unipar.cluster.corrections`; ``None``: as specified)."""

    name: str
    nodes: int
    devices_per_node: int
    device: DeviceSpec
    intra_node: LinkSpec
    inter_node: LinkSpec
    machine: str = ""
    corrections: Corrections | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise ConfigError(
                f"a cluster needs nodes >= 1 and devices_per_node >= 1, but got "
                f"nodes={self.nodes}, devices_per_node={self.devices_per_node}"
            )

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def as_trained_by_unipar(self) -> ClusterSpec:
        """This cluster as unipar's runtime trains on it: in float32 (no autocast; PyTorch
        keeps TF32 off for matrix products by default, so they run at the device's FP32
        peak) and eager (one kernel per op, no compiler), not the fused bf16 of the
        presets' published runs. Measured on one H100 (``benchmarks/gpu_check.py``,
        docs/planner-learning.md): a 118M-parameter GPT ran 0.247 s a step where the
        bf16 preset predicted 0.027 s. Eager ops also cost the host its time per op
        (:data:`EAGER_HOST_OP_S`), which a small model's short kernels do not hide: the
        0.88M-parameter demo GPT ran 12 ms a step where the kernels alone were priced at
        2.5 ms."""
        device = replace(
            self.device,
            precision=Precision.FP32,
            kernels=Kernels.EAGER,
            host_op_s=EAGER_HOST_OP_S,
        )
        return replace(self, device=device)

    def resized(self, nodes: int, devices_per_node: int | None = None) -> ClusterSpec:
        """Another size of this cluster, as specified: corrections learned on one size
        are not carried to another (another size is another cluster)."""
        base = self if self.corrections is None else self.corrections.base
        return replace(
            base, nodes=nodes, devices_per_node=devices_per_node or self.devices_per_node
        )


# Spec sheets: NVIDIA A100 datasheet (2021), H100 datasheet (2023), V100 datasheet (2018);
# AWS p3.16xlarge: 8 V100-16GB, 25 Gb/s network. GEMM efficiency ~0.8 of the bf16 peak
# for large products on A100/H100 (cuBLAS, NVIDIA's "Matrix multiplication background"
# guide); NCCL all-reduce bus bandwidth within a DGX A100 ~230 GB/s of the 300 GB/s
# NVLink (nccl-tests); HDR InfiniBand 200 Gb/s per GPU, 8 per DGX node.
_A100_80 = DeviceSpec(
    name="A100-SXM4-80GB",
    memory_gib=80,
    peak_flops_16bit=312e12,
    peak_flops_32bit=19.5e12,
    memory_bandwidth=2.039e12,
    gemm_efficiency=0.80,
    kernel_overhead_s=8e-6,
    reserved_gib=3.0,
    attention=AttentionKernel.FLASH,
    attention_efficiency=0.6,
)
_A100_40 = replace(_A100_80, name="A100-SXM4-40GB", memory_gib=40, memory_bandwidth=1.555e12)
# Attention on Hopper: PyTorch's scaled_dot_product_attention runs FlashAttention-2,
# which reaches 35% of the H100's peak (Shah et al. 2024, FlashAttention-3, Sec. 1).
_H100_80 = DeviceSpec(
    name="H100-SXM5-80GB",
    memory_gib=80,
    peak_flops_16bit=989e12,
    peak_flops_32bit=67e12,
    memory_bandwidth=3.35e12,
    gemm_efficiency=0.75,
    kernel_overhead_s=6e-6,
    reserved_gib=3.0,
    attention=AttentionKernel.FLASH,
    attention_efficiency=0.35,
)
# The H100 of Meta's Grand Teton hosts (torchtitan's benchmarks): 96 GB HBM2e at
# 2.4 TB/s, power-capped at 500 W, with a peak "between SXM and NVL" (torchtitan,
# docs/performance.md): the lower bound, the H100 NVL's 835 TFLOP/s dense bf16.
_H100_96_HBM2E = replace(
    _H100_80,
    name="H100-HBM2e-96GB-500W",
    memory_gib=96 * 1e9 / GIB,
    peak_flops_16bit=835e12,
    peak_flops_32bit=60e12,
    memory_bandwidth=2.4e12,
)
# H200 SXM (NVIDIA H200 datasheet, 2024): the H100's compute (989 TFLOP/s dense bf16)
# with 141 GB of HBM3e at 4.8 TB/s; NVLink 4 as on the H100 (900 GB/s both ways).
_H200_141 = replace(_H100_80, name="H200-SXM-141GB", memory_gib=141, memory_bandwidth=4.8e12)
_V100_16 = DeviceSpec(
    name="V100-SXM2-16GB",
    memory_gib=16,
    peak_flops_16bit=125e12,
    peak_flops_32bit=15.7e12,
    memory_bandwidth=0.9e12,
    gemm_efficiency=0.75,
    kernel_overhead_s=10e-6,
    reserved_gib=1.5,
)
_DGX_A100_NVLINK = LinkSpec(bandwidth=230e9, latency_s=10e-6)
_DGX_A100_IB = LinkSpec(bandwidth=8 * 23e9, latency_s=15e-6)
_H100_NVLINK = LinkSpec(bandwidth=360e9, latency_s=8e-6)  # NVLink 4: 450 GB/s one way
_H100_NETWORK = LinkSpec(bandwidth=8 * 45e9, latency_s=12e-6)  # 8 x 400 Gb/s (NDR, RoCE)

PRESETS: dict[str, ClusterSpec] = {
    "a100-80g": ClusterSpec("a100-80g", 1, 8, _A100_80, _DGX_A100_NVLINK, _DGX_A100_IB),
    "a100-40g": ClusterSpec("a100-40g", 1, 8, _A100_40, _DGX_A100_NVLINK, _DGX_A100_IB),
    "h100-80g": ClusterSpec(
        "h100-80g",
        1,
        8,
        _H100_80,
        _H100_NVLINK,
        _H100_NETWORK,
    ),
    "h100-96g-hbm2e": ClusterSpec(
        "h100-96g-hbm2e",
        1,
        8,
        _H100_96_HBM2E,
        _H100_NVLINK,
        _H100_NETWORK,
    ),
    "h200-141g": ClusterSpec(
        "h200-141g",
        1,
        8,
        _H200_141,
        _H100_NVLINK,
        _H100_NETWORK,
    ),
    "v100-16g": ClusterSpec(
        "v100-16g",
        1,
        8,
        _V100_16,
        LinkSpec(bandwidth=120e9, latency_s=12e-6),  # NVLink 2 hybrid cube mesh
        LinkSpec(bandwidth=25e9 / 8, latency_s=50e-6),  # p3.16xlarge: 25 Gb/s per node
    ),
}


class Rate(Enum):
    """A group of the cost model's rates that one factor corrects."""

    COMPUTE = "compute"
    PER_OP = "per-op"
    FRAMEWORK = "framework"
    SHARDING = "sharding"
    INTRA_NODE = "intra-node link"
    INTER_NODE = "network"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class Corrections:
    """The factors applied to ``base`` (the cluster as specified or calibrated), fitted
    from ``runs`` measured runs on it (``kept_apart``: runs on an overloaded machine,
    left out of the fit)."""

    factors: tuple[tuple[Rate, float], ...]
    runs: int
    base: ClusterSpec
    kept_apart: int = 0

    def factor(self, rate: Rate) -> float:
        return dict(self.factors).get(rate, 1.0)

    def describe(self, threshold: float = 0.02) -> str:
        """``corrected from 3 runs on this cluster: compute x0.71, ...``: the factors
        that differ from 1 by more than ``threshold``."""
        moved = [
            f"{rate.value} x{value:.2f}"
            for rate, value in self.factors
            if abs(value - 1) > threshold
        ]
        runs = f"{self.runs} run{'s' * (self.runs != 1)}"
        shown = ", ".join(moved) or "no factor moved by more than 2%"
        return f"corrected from {runs} on this cluster: {shown}"
