"""The published runs of ``tests/reference/modern_runs.csv``, planned with their
published plan pinned. Shared by the tests and ``benchmarks/plan_speed.py``."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from unipar.analysis.profile import LayerKind
from unipar.cluster import cluster_preset
from unipar.models.hf_config import hf_spec
from unipar.plan import Constraints, Recompute, plan
from unipar.plan.report import PlanReport

HERE = Path(__file__).resolve().parent
TABLE = HERE / "reference" / "modern_runs.csv"
CONFIGS = HERE / "hf_configs"
ROWS = list(csv.DictReader(TABLE.open()))


@dataclass(frozen=True)
class Outcome:
    row: dict[str, str]
    pinned: PlanReport
    measured_step_s: float

    @property
    def predicted_step_s(self) -> float:
        return self.pinned.best.estimate.step_time_s

    @property
    def error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1


def torchtitan_flops_per_token(report: PlanReport, seq: int) -> float:
    """torchtitan's count (train.py): 6 x (parameters but the token embedding) +
    12 x layers x hidden x seq, attention counted whole (no causal halving)."""
    profile = report.profile
    embedding = sum(x.params for x in profile.layers if x.kind is LayerKind.EMBEDDING)
    return 6 * (profile.params - embedding) + 12 * profile.num_blocks * profile.hidden * seq


def pinned_constraints(row: dict[str, str]) -> Constraints:
    """The published plan: its mesh, and the micro-batch and recompute where given
    (``selective_op``: torchtitan's op-level selective checkpointing)."""
    recompute = row["recompute"]
    return Constraints(
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        dp=int(row["dp"]),
        fsdp=int(row["fsdp"]),
        cp=int(row["cp"]),
        microbatch_size=int(row["microbatch"]) if row["microbatch"] else None,
        recompute=Recompute(recompute) if recompute else None,
        recompute_every=1 if recompute == "full" else None,  # full: every layer
    )


def plan_row(row: dict[str, str], constraints: Constraints | None = None) -> PlanReport:
    gpus = int(row["gpus"])
    cluster = cluster_preset(
        row["cluster"],
        nodes=max(1, gpus // 8),
        devices_per_node=min(8, gpus),
        kernels=row["kernels"],
    )
    spec = hf_spec(CONFIGS / row["config"], seq_len=int(row["seq"]))
    return plan(spec, cluster, int(row["global_batch"]), constraints=constraints)


def outcome(row: dict[str, str]) -> Outcome:
    pinned = plan_row(row, pinned_constraints(row))
    gpus, seq, batch = int(row["gpus"]), int(row["seq"]), int(row["global_batch"])
    value = float(row["value"])
    if row["metric"] == "tokens_per_s_per_gpu":
        measured = batch * seq / (value * gpus)
    else:
        assert row["metric"] == "model_tflops_per_gpu" and row["flops_per_token"] == "torchtitan"
        measured = batch * seq * torchtitan_flops_per_token(pinned, seq) / (value * 1e12 * gpus)
    return Outcome(row, pinned, measured)
