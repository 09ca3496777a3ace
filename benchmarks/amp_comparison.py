"""Our cost formulas on AMP's published heterogeneous-cluster trials
(tests/reference/amp_het_cluster.csv), beside AMP's own cost model.

Nothing is fitted to the measured times: the devices are spec-sheet figures (V100 as
the ``v100-16g`` preset; T4: 65 TFLOP/s fp16, NVIDIA T4 datasheet, with the V100's
GEMM efficiency), the links are AMP's own cluster description (src/het_cluster.py:
nodes 0-2 at 170 Gb/s inside and 10 Gb/s out; node 3 at 50 Gb/s both), ranks laid
out as DeepSpeed's pipe-data-model topology (model innermost, 4 ranks per node,
node 3 the T4 node). AMP's 30 layer units are taken as 3 before the 24 blocks and 3
after (embedding; final norm and head). Step time: ``(M + S - 1)`` times the slowest
stage's micro-batch time (compute + TP all-reduces + activations sent on), plus the
slowest stage's gradient all-reduce over its data-parallel ranks (the formulas of
unipar.plan.hetero). Last line: ``RESULT ours_median_err=.. ours_spearman=..
amp_median_err=.. amp_spearman=..``.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from scipy.stats import spearmanr

CSV = Path(__file__).resolve().parents[1] / "tests" / "reference" / "amp_het_cluster.csv"
H, S, V, GBS = 1024, 1024, 52256, 32
V100 = 125e12 * 0.75
T4 = 65e12 * 0.75
INTRA = [170e9 / 8] * 3 + [50e9 / 8]
INTER = [10e9 / 8] * 3 + [50e9 / 8]
BYTES = 2  # fp16


def _unit_flops(unit: int) -> float:
    if 3 <= unit < 27:
        return 3 * (24 * S * H * H + 4 * S * S * H)
    return 3 * 2 * S * H * V if unit == 28 else 0.0


def _unit_params(unit: int) -> float:
    if 3 <= unit < 27:
        return 12 * H * H
    return V * H if unit in (1, 28) else 0.0


def _ring(nbytes: float, ranks: int, bandwidth: float) -> float:
    return 0.0 if ranks <= 1 else 2 * (ranks - 1) / ranks * nbytes / bandwidth


def predict(mbs: int, mp: int, dp: int, pp: int, parts: list[int]) -> float:
    micro = GBS // (dp * mbs)
    stage_s, grad_s = [], []
    for k in range(pp):
        ranks = range(k * dp * mp, (k + 1) * dp * mp)
        nodes = sorted({r // 4 for r in ranks})
        rate = min(T4 if n == 3 else V100 for n in nodes)
        units = range(parts[k], parts[k + 1])
        compute = sum(_unit_flops(u) for u in units) * mbs / (mp * rate)
        blocks = sum(1 for u in units if 3 <= u < 27)
        act = mbs * S * H * BYTES
        tp = 4 * blocks * _ring(act, mp, min(INTRA[n] for n in nodes))
        send = 0.0
        if k + 1 < pp:
            here, there = (k + 1) * dp * mp - 1, (k + 1) * dp * mp
            link = (
                INTRA[here // 4]
                if here // 4 == there // 4
                else min(INTER[here // 4], INTER[there // 4])
            )
            send = 2 * act / mp / link
        stage_s.append(compute + tp + send)
        # a data-parallel group spanning nodes is bound by the slowest node network
        dp_link = min((INTER if len(nodes) > 1 else INTRA)[n] for n in nodes)
        params = sum(_unit_params(u) for u in units) / mp
        grad_s.append(_ring(params * BYTES, dp, dp_link))
    return (micro + pp - 1) * max(stage_s) + max(grad_s)


def main() -> None:
    lines = [line for line in CSV.read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    measured = [float(r["measured_s"]) for r in rows]
    amp = [float(r["amp_predicted_s"]) for r in rows]
    ours = [
        predict(
            int(r["microbatch"]),
            int(r["mp"]),
            int(r["dp"]),
            int(r["pp"]),
            [int(x) for x in r["partition"].split()],
        )
        for r in rows
    ]
    for r, o in zip(rows, ours, strict=True):
        print(
            f"trial {r['trial']:>2} mbs={r['microbatch']:>2} mp={r['mp']} dp={r['dp']:>2} "
            f"pp={r['pp']:>2} measured {r['measured_s']:>5} s AMP {r['amp_predicted_s']} s "
            f"ours {o:.3f} s"
        )

    def err(pred: list[float]) -> float:
        return statistics.median(abs(p / m - 1) for p, m in zip(pred, measured, strict=True))

    print(
        f"RESULT ours_median_err={err(ours):.3f} ours_spearman={spearmanr(ours, measured)[0]:.3f} "
        f"amp_median_err={err(amp):.3f} amp_spearman={spearmanr(amp, measured)[0]:.3f}"
    )


if __name__ == "__main__":
    main()
