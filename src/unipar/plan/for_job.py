"""Plan a :class:`~unipar.job.Job`: its model and one real sample go to the planner."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from torch.utils.data import default_collate

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.job import Job
from unipar.models.hf import hf_model_facts
from unipar.models.spec import ModelSpec
from unipar.plan.grad_sync import parameter_facts
from unipar.plan.presets import Strategy, constraints_for
from unipar.plan.report import PlanReport, model_profile, plan
from unipar.plan.sync_cost import WORTH_SERVING_SHARE


@dataclass(frozen=True)
class JobFacts:
    """What the driver learns of a job before any worker starts, each thing once: a
    batch of its dataset's first two samples, its model built on the meta device
    (``spec.meta_model``), and, on first use, the planner's analysis of that model and
    the share of its parameters in embedding tables."""

    job: Job
    spec: ModelSpec
    inputs: Any  # the first two samples' inputs, collated (one where the dataset has one)
    targets: Any

    @functools.cached_property
    def profile(self) -> ModelProfile:
        return model_profile(self.spec)

    @functools.cached_property
    def serves_embeddings(self) -> bool:
        """Whether the model's embedding tables are worth parameter servers (the planner
        then prices them; see :mod:`unipar.plan.grad_sync`)."""
        return parameter_facts(self.spec.meta_model).table_share >= WORTH_SERVING_SHARE


def job_facts(job: Job) -> JobFacts:
    """The job's model for the planner, its input shape and dtype taken from the first
    sample of its dataset. unipar's reference models also tell their residual width and
    the sizes tensor parallelism must divide (``model.config.spec()``); so does a Hugging
    Face model's config (heads, key/value heads, MLP width, vocabulary)."""
    dataset = job.dataset()
    if len(dataset) == 0:
        raise ConfigError("the job's dataset is empty; give it at least one sample")
    inputs, targets = default_collate([dataset[0], dataset[min(1, len(dataset) - 1)]])
    spec = ModelSpec(
        name=job.name,
        factory=job.model,
        sample_shape=tuple(inputs.shape[1:]),
        input_dtype=inputs.dtype,
        tokens_per_sample=targets[0].numel() if targets.dim() > 1 else 1,
        loss=job.loss,
        target=(tuple(targets.shape[1:]), targets.dtype),
    )
    meta_model = spec.meta_model
    reference = getattr(getattr(meta_model, "config", None), "spec", None)
    known = reference() if callable(reference) else hf_model_facts(meta_model)
    if known:
        spec = _with_known_sizes(spec, known.hidden, known.tp_divisibility)
    return JobFacts(job=job, spec=spec, inputs=inputs, targets=targets)


def _with_known_sizes(
    spec: ModelSpec, hidden: int | None, tp_divisibility: tuple[tuple[str, int], ...]
) -> ModelSpec:
    """``spec`` with the model's residual width and tensor-parallel sizes, keeping the
    meta build already made."""
    known = replace(spec, hidden=hidden, tp_divisibility=tp_divisibility)
    known.__dict__["meta_model"] = spec.meta_model  # the one build, not a second
    return known


def job_model_spec(job: Job) -> ModelSpec:
    """The planner's view of ``job``'s model (see :func:`job_facts`)."""
    return job_facts(job).spec


def plan_job(
    job: Job | JobFacts,
    cluster: ClusterSpec,
    strategy: Strategy = Strategy.AUTO,
    *,
    consider_servers: bool = True,
) -> PlanReport:
    """The planner's report for ``job`` on all of ``cluster``'s devices (its facts,
    when already learned, are reused: no second build of the model)."""
    facts = job if isinstance(job, JobFacts) else job_facts(job)
    constraints = constraints_for(strategy, cluster.num_devices)
    return plan(
        facts.spec,
        cluster,
        facts.job.global_batch_size,
        constraints=constraints,
        consider_servers=consider_servers,
        profile=facts.profile,
    )
