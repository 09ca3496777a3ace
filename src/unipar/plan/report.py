"""``plan()``: analyse, search, and report the choice with its numbers and reasons."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from unipar.analysis.profile import ModelProfile, analyze
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.models.spec import ModelSpec
from unipar.plan.grad_sync import GradSyncDecision, decide_grad_sync, sparse_facts
from unipar.plan.representation import GradSync
from unipar.plan.strategy_search import Candidate, Constraints, SearchResult, search
from unipar.ps.cost import SyncKind


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
        if decision is None or decision.kind is not SyncKind.PARAMETER_SERVER:
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
            "mfu": e.model_flops / step / devices / self.cluster.device.peak_flops,
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
                "zero": _zero_level(self.best),
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
        from unipar.plan.explain import explain

        return explain(self)

    def plot(self, directory: Any) -> Any:
        """Write ``timeline.png``, ``memory.png`` and ``breakdown.png`` into ``directory``
        (a path; needs ``pip install unipar[plot]``); returns their paths
        (:class:`unipar.viz.plan_pictures.PlanPictures`)."""
        from unipar.viz.plan_pictures import plot_plan

        return plot_plan(self, directory)


def _zero_level(candidate: Candidate) -> int:
    mesh = candidate.plan.mesh
    if mesh.fsdp == 1:
        return 1 if candidate.plan.distributed_optimizer else 0
    return 3 if candidate.plan.reshard_after_forward else 2


def describe(candidate: Candidate) -> str:
    plan = candidate.plan
    mesh = plan.mesh
    parts = [f"tp={mesh.tp}", f"pp={mesh.pp}", f"dp={mesh.dp}", f"fsdp={mesh.fsdp}"]
    if mesh.cp > 1:
        parts.append(f"cp={mesh.cp}")
    if plan.sequence_parallel:
        parts.append("sp")
    if _zero_level(candidate):
        parts.append(f"zero={_zero_level(candidate)}")
    parts.append(f"mb={plan.microbatch_size}x{plan.num_microbatches}")
    if mesh.pp > 1:
        virtual = f"(v={plan.virtual_stages})" if plan.virtual_stages > 1 else ""
        parts.append(f"{plan.schedule.value}{virtual}")
    every = f"(every {plan.recompute_every})" if plan.recompute_every > 1 else ""
    parts.append(f"recompute={plan.recompute.value}{every}")
    return " ".join(parts)


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
    import time

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
