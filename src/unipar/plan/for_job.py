"""Plan a :class:`~unipar.job.Job`: its model and one real sample go to the planner."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.data.batch import Batch, check_batch, collate, first_tensor, rows, tokens_per_sample
from unipar.errors import ConfigError
from unipar.job import Job, ModelCall
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
    # The first two samples' inputs and targets, collated (a tensor or a tree of them;
    # the sample is repeated where the dataset has one).
    inputs: Any
    targets: Any

    @functools.cached_property
    def profile(self) -> ModelProfile:
        return model_profile(self.spec)

    @functools.cached_property
    def serves_embeddings(self) -> bool:
        """Whether the model's embedding tables are worth parameter servers (the planner
        then prices them; see :mod:`unipar.plan.grad_sync`)."""
        return parameter_facts(self.spec.meta_model).table_share >= WORTH_SERVING_SHARE


def job_batch(job: Job) -> Batch:
    """The job's first two samples, collated: the batch every check before the run
    reads. A batch the runtime cannot split (a leaf that is not a tensor, or without the
    batch dimension) is refused with the key at fault."""
    dataset = job.dataset()
    if len(dataset) == 0:
        raise ConfigError("the job's dataset is empty; give it at least one sample")
    samples = [dataset[0], dataset[min(1, len(dataset) - 1)]]
    inputs, targets = collate(samples, job.collate)
    check_batch(inputs, targets, len(samples), named_inputs=job.call is ModelCall.KWARGS)
    return inputs, targets


def job_facts(job: Job, batch: Batch | None = None) -> JobFacts:
    """The job's model for the planner, its inputs taken from the first samples of its
    dataset (``batch``, when already collated by :func:`job_batch`). unipar's reference
    models also tell their residual width and the sizes tensor parallelism must divide
    (``model.config.spec()``); so does a Hugging Face model's config (heads, key/value
    heads, MLP width, vocabulary)."""
    inputs, targets = job_batch(job) if batch is None else batch
    first_input, first_target = first_tensor(inputs), first_tensor(targets)
    plain = isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)
    spec = ModelSpec(
        name=job.name,
        factory=job.model,
        sample_shape=tuple(first_input.shape[1:]),
        input_dtype=first_input.dtype,
        tokens_per_sample=tokens_per_sample(targets),
        loss=job.loss if job.step is None else None,  # a custom step's loss is its own
        target=(tuple(first_target.shape[1:]), first_target.dtype),
        # A tree of inputs (ids and a mask) is analysed as it is; its attention core is
        # not told apart, and context parallelism (which cuts one token tensor) not tried.
        sample=None if plain else rows(inputs, 0, 1),
        targets_sample=None if plain else rows(targets, 0, 1),
        call=job.call,
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
    when already learned, are reused: no second build of the model). A job with its own
    step is planned without pipeline or context parallelism, which it cannot run under
    (the schedule owns the step; each rank sees a chunk of every sequence)."""
    facts = job if isinstance(job, JobFacts) else job_facts(job)
    constraints = constraints_for(strategy, cluster.num_devices)
    if facts.job.step is not None:
        constraints = replace(constraints, pp=1, cp=1)
    return plan(
        facts.spec,
        cluster,
        facts.job.global_batch_size,
        constraints=constraints,
        consider_servers=consider_servers,
        profile=facts.profile,
    )
