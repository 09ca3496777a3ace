"""``plan()``: analyse, search, and report the choice with its numbers and reasons."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from unipar.analysis.profile import ModelProfile, analyze
from unipar.cluster.corrections import base_cluster
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.models.spec import ModelSpec
from unipar.plan.explain import (
    corrections_text,
    count_text,
    describe,
    exchange_text,
    versus_text,
    zero_level,
)
from unipar.plan.grad_sync import GradSyncDecision, decide_grad_sync, sparse_facts
from unipar.plan.representation import GradSync
from unipar.plan.strategy_search import Candidate, Constraints, SearchResult, search


@dataclass(frozen=True)
class PlanReport:
    result: SearchResult
    profile: ModelProfile
    cluster: ClusterSpec
    global_batch_size: int
    tokens_per_sample: int
    analysis_time_s: float
    grad_sync: GradSyncDecision | None = None  # all-reduce or parameter servers

    @property
    def best(self) -> Candidate:
        """The chosen plan; when parameter servers win, with ``grad_sync`` set to them
        and their exchange time in place of the all-reduce's."""
        decision = self.grad_sync
        if decision is None or decision.kind is not GradSync.PARAMETER_SERVER:
            return self.result.best
        assert decision.choice is not None and decision.candidate is not None
        dp = decision.candidate
        time = replace(dp.estimate.time, grad_sync_s=decision.choice.ps.comm_s, optimizer_s=0.0)
        return Candidate(
            replace(dp.plan, grad_sync=GradSync.PARAMETER_SERVER, distributed_optimizer=False),
            replace(dp.estimate, time=time),
        )

    def predicted(self, candidate: Candidate | None = None) -> dict[str, float]:
        """Numbers of a candidate. ``tflops_per_device`` counts the FLOPs the devices
        execute, recompute included (as Narayanan et al. 2021 report); ``mfu`` counts
        the model's own FLOPs (no recompute) against the peak (Chowdhery et al. 2022)."""
        c = candidate or self.best
        e, plan = c.estimate, c.plan
        devices = plan.mesh.world_size
        step = e.step_time_s
        executed = e.model_flops * (1 + plan.recomputed_fraction / 3)
        return {
            "step_time_s": step,
            "memory_gib_per_device": e.memory.total_gib,
            "tflops_per_device": executed / step / devices / 1e12,
            # against the spec sheet's peak, not a peak corrected by measured runs
            "mfu": e.model_flops / step / devices / base_cluster(self.cluster).device.peak_flops,
            "tokens_per_s": self.global_batch_size * self.tokens_per_sample / step,
        }

    def to_dict(self) -> dict[str, Any]:
        plan = self.best.plan
        e = self.best.estimate
        return {
            "plan": {
                "tp": plan.mesh.tp,
                "pp": plan.mesh.pp,
                "dp": plan.mesh.dp,
                "fsdp": plan.mesh.fsdp,
                "cp": plan.mesh.cp,
                "sequence_parallel": plan.sequence_parallel,
                "distributed_optimizer": plan.distributed_optimizer,
                "microbatch_size": plan.microbatch_size,
                "num_microbatches": plan.num_microbatches,
                "schedule": plan.schedule.value,
                "virtual_stages": plan.virtual_stages,
                "recompute": plan.recompute.value,
                "recompute_every": plan.recompute_every,
                "zero": zero_level(self.best),
                "stage_boundaries": list(plan.stage_boundaries),
                "grad_sync": plan.grad_sync.value,
            },
            "predicted": {
                **self.predicted(),
                "time_breakdown_s": vars(e.time),
                "memory_breakdown_gib": vars(e.memory),
            },
            "full_plan": plan.to_dict(),
            "cluster": {
                "name": self.cluster.name,
                "nodes": self.cluster.nodes,
                "devices_per_node": self.cluster.devices_per_node,
                "device": self.cluster.device.name,
                "corrections": _corrections(self.cluster),
            },
            "model": {"params": self.profile.params, "layers": len(self.profile.layers)},
            "alternatives": [self._summary(c) for c in self.result.ranked[1:]],
            "plans_evaluated": self.result.evaluated,
            "analysis_time_s": self.analysis_time_s,
            "search_time_s": self.result.search_time_s,
        }

    def _summary(self, candidate: Candidate) -> dict[str, Any]:
        return {"plan": describe(candidate), **self.predicted(candidate)}

    def explain(self) -> str:
        """The choice, its numbers, and why the others lost (pictures of it:
        :func:`unipar.viz.plan_pictures.plot_plan`)."""
        best = self.best
        p = self.predicted()
        e = best.estimate
        cluster = self.cluster
        lines = [
            f"model: {count_text(self.profile.params)} parameters, {len(self.profile.layers)} "
            f"layers; cluster: {cluster.nodes} x {cluster.devices_per_node} {cluster.device.name} "
            f"({cluster.device.memory_gib:.1f} GiB); global batch {self.global_batch_size}",
            *corrections_text(cluster),
            f"searched {self.result.evaluated} plans in {self.result.search_time_s:.2f} s "
            f"(analysis {self.analysis_time_s:.2f} s)",
            "",
            f"chosen: {describe(best)}",
            f"  step time      {p['step_time_s']:.3f} s   ({p['tokens_per_s']:,.0f} tokens/s)",
            f"  per device     {p['tflops_per_device']:.1f} TFLOP/s executed, MFU {p['mfu']:.1%}",
            "  time           "
            + ", ".join(
                f"{name.removesuffix('_s').replace('_', ' ')} {value:.3f}"
                for name, value in vars(e.time).items()
                if value > 0
            ),
            f"  memory/device  {e.memory.total_gib:.1f} GiB of {cluster.device.memory_gib:.1f}: "
            + ", ".join(
                f"{name.removesuffix('_gib')} {value:.1f}" for name, value in vars(e.memory).items()
            ),
        ]
        if best.plan.stage_boundaries:
            lines.append(f"  stages start at layers {list(best.plan.stage_boundaries)}")
        if self.grad_sync is not None:
            lines.append(f"  gradients      {exchange_text(self.grad_sync)}")
        alternatives = self.result.ranked[1:6]
        if alternatives:
            lines += ["", "next best (slower by):"]
            lines += [versus_text(best, c, describe(c)) for c in alternatives]
        rejected = self.result.rejected[:3]
        if rejected:
            lines += ["", "rejected, over memory (by):"]
            lines += [
                f"  {describe(c):60s} needs {c.estimate.memory.total_gib:.1f} GiB "
                f"(+{c.estimate.memory.total_gib - cluster.device.memory_gib:.1f})"
                for c in rejected
            ]
        return "\n".join(lines)


def _corrections(cluster: ClusterSpec) -> dict[str, Any] | None:
    """The learned factors applied to the cluster's rates (``None``: as specified)."""
    corrections = cluster.corrections
    if corrections is None:
        return None
    return {
        "runs": corrections.runs,
        "kept_apart": corrections.kept_apart,
        "factors": {rate.value: value for rate, value in corrections.factors},
    }


def model_profile(model: ModelSpec) -> ModelProfile:
    """The analysis of ``model`` (its meta-device build) on one sample."""
    return analyze(
        model.meta_model,
        model.sample_inputs,
        hidden=model.hidden,
        tp_divisibility=model.tp_divisibility,
        loss=model.loss,
        target=model.sample_targets(),
        attention_seq=model.attention_seq,
        causal_attention=model.causal_attention,
        call=model.call,
    )


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    *,
    constraints: Constraints | None = None,
    keep: int = 8,
    consider_servers: bool = True,
    profile: ModelProfile | None = None,
) -> PlanReport:
    """Choose how to train ``model`` on ``cluster``; nothing is allocated or run.
    ``keep``: how many of the fitting plans the report ranks.

    ``model`` is a :class:`~unipar.models.ModelSpec`: the reference configs make one with
    ``.spec()``, or wrap your own factory with ``ModelSpec(name, factory, sample_shape)``.
    ``consider_servers``: also price parameter servers for the gradient exchange
    (:mod:`unipar.plan.grad_sync`; False where the run could not use them).
    ``profile``: the model's analysis when already made (:func:`model_profile`); planning
    the same model for several clusters or sizes analyses it once.
    """
    if global_batch_size < 1:
        raise ConfigError(f"global_batch_size must be >= 1, but got {global_batch_size}")
    started = time.perf_counter()
    if profile is None:
        profile = model_profile(model)
    analysis_time = time.perf_counter() - started
    result = search(profile, cluster, global_batch_size, constraints or Constraints(), keep=keep)
    decision = (
        decide_grad_sync(
            profile,
            sparse_facts(model),
            cluster,
            global_batch_size,
            constraints or Constraints(),
            result.best,
        )
        if consider_servers
        else None
    )
    return PlanReport(
        result=result,
        profile=profile,
        cluster=cluster,
        global_batch_size=global_batch_size,
        tokens_per_sample=model.tokens_per_sample,
        analysis_time_s=analysis_time,
        grad_sync=decision,
    )
