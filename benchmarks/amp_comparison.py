"""Our step-time model on AMP's published heterogeneous-cluster trials
(tests/reference/amp_het_cluster.csv), beside AMP's own cost model.

Nothing is fitted to the measured times. The trials ran DeepSpeed's pipe engine on
Megatron's GPT-2 (AMP's repository, DeepSpeed/DeepSpeedExamples/Megatron-LM-v1.1.5-
3D_parallelism: ``--fp16``, ``"fp32_allreduce": true``, no activation checkpointing) on
3 AWS p3.8xlarge nodes (4 V100-SXM2 each) and 1 g4dn.12xlarge (4 T4), the T4 node last
(AMP's src/het_cluster.py). The testbed as :mod:`unipar.plan.placed` sees it:

- V100: 39 TFLOP/s sustained over a whole Megatron GPT-2 step, 30% of its 125 TFLOP/s
  (Shoeybi et al. 2019, Sec. 5.1, the single-GPU baseline). T4: power-capped at 70 W,
  its fp16 matrix products sustain about 24 TFLOP/s, not the 65 of the datasheet (NVIDIA
  developer forum, "About GPU peak performance", cuBLAS 4096^3); a whole step reaches
  the same fraction of that as the V100 does of its sustained GEMM rate
  (39 / (0.75 * 125)): 24 * 0.30 / 0.75 = 9.6 TFLOP/s. Memory: 900 and 320 GB/s.
- Links (AMP's src/het_cluster.py and paper, AWS instance pages): p3.8xlarge NVLink
  170 Gb/s per GPU inside, 10 Gb/s network; g4dn.12xlarge PCIe 50 Gb/s inside, 50 Gb/s
  network; 50 us per message over TCP, 12-15 us inside a node.
- Model units as DeepSpeed's GPT2ModelPipe lists them (the 30 units AMP's partitions
  cut): embedding (tied), transpose, 24 blocks, transpose, final norm, logits (the tied
  embedding), fp16-to-fp32. Tensor-parallel all-reduces per micro-batch: 4 per block
  (Megatron), 1 at the embedding (forward) and 1 at the logits (backward).

Last line: ``RESULT ours_median_err=.. ours_spearman=.. amp_median_err=.. amp_spearman=..``.
With the T4 at 30% of its datasheet peak instead (19.5 TFLOP/s, ignoring the power
cap) the figures are 0.217 / 0.701: the rank correlation does not hinge on that choice.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from scipy.stats import spearmanr

from unipar.cluster.spec import LinkSpec
from unipar.plan.hetero import LayerProfile
from unipar.plan.placed import Placed3DPlan, PlacedNode, predict_placed

CSV = Path(__file__).resolve().parents[1] / "tests" / "reference" / "amp_het_cluster.csv"
H, S, V, LAYERS, GBS = 1024, 1024, 52256, 24, 32
V100_STEP_FLOPS = 0.30 * 125e12
T4_STEP_FLOPS = 24e12 * 0.30 / 0.75
P3 = PlacedNode(
    "p3.8xlarge", 4, V100_STEP_FLOPS, 900e9, LinkSpec(170e9 / 8, 12e-6), LinkSpec(10e9 / 8, 50e-6)
)
G4 = PlacedNode(
    "g4dn.12xlarge", 4, T4_STEP_FLOPS, 320e9, LinkSpec(50e9 / 8, 15e-6), LinkSpec(50e9 / 8, 50e-6)
)
NODES = (P3, P3, P3, G4)


def gpt2_units() -> tuple[tuple[LayerProfile, ...], tuple[int, ...]]:
    """The 30 pipe units (fp16 activations) and their tensor-parallel all-reduces."""
    act = S * H * 2
    block = LayerProfile(3 * (24 * S * H * H + 4 * S * S * H), 12 * H * H + 13 * H, 0, act)
    free = LayerProfile(0, 0, 0, act)
    embed = LayerProfile(0, V * H + S * H, 0, act)
    norm = LayerProfile(0, 2 * H, 0, act)
    logits = LayerProfile(3 * 2 * S * H * V, V * H, 0, S * V * 2)
    layers = (embed, free, *[block] * LAYERS, free, norm, logits, free)
    return layers, (1, 0, *[4] * LAYERS, 0, 0, 1, 0)


def main() -> None:
    lines = [line for line in CSV.read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    layers, allreduces = gpt2_units()
    measured = [float(r["measured_s"]) for r in rows]
    amp = [float(r["amp_predicted_s"]) for r in rows]
    ours = []
    for r in rows:
        plan = Placed3DPlan(
            global_batch_size=GBS,
            microbatch_size=int(r["microbatch"]),
            tp=int(r["mp"]),
            dp=int(r["dp"]),
            pp=int(r["pp"]),
            stage_starts=tuple(int(x) for x in r["partition"].split()),
        )
        step = predict_placed(layers, allreduces, NODES, plan, tied_params=V * H)
        ours.append(step.total_s)
        print(
            f"trial {r['trial']:>2} mbs={r['microbatch']:>2} mp={r['mp']} dp={r['dp']:>2} "
            f"pp={r['pp']:>2} measured {r['measured_s']:>5} s AMP {r['amp_predicted_s']} s "
            f"ours {step.total_s:.3f} s (pipeline {step.pipeline_s:.2f}, dp all-reduce "
            f"{step.data_parallel_s:.2f}, tied {step.tied_s:.2f}, optimizer {step.optimizer_s:.2f})"
        )

    def err(pred: list[float]) -> float:
        return statistics.median(abs(p / m - 1) for p, m in zip(pred, measured, strict=True))

    print(
        f"RESULT ours_median_err={err(ours):.3f} ours_spearman={spearmanr(ours, measured)[0]:.3f} "
        f"amp_median_err={err(amp):.3f} amp_spearman={spearmanr(amp, measured)[0]:.3f}"
    )


if __name__ == "__main__":
    main()
