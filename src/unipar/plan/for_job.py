"""Plan a :class:`~unipar.job.Job`: its model and one real sample go to the planner."""

from __future__ import annotations

import torch
from torch.utils.data import default_collate

from unipar.analysis.profile import SkipInPlaceOnMeta
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.job import Job
from unipar.models.hf import hf_model_facts
from unipar.models.spec import ModelSpec
from unipar.plan.grad_sync import parameter_facts
from unipar.plan.presets import Strategy, constraints_for
from unipar.plan.report import PlanReport, plan
from unipar.plan.sync_cost import WORTH_SERVING_SHARE


def job_model_spec(job: Job) -> ModelSpec:
    """The job's model for the planner, its input shape and dtype taken from the first
    sample of its dataset. unipar's reference models also tell their residual width and
    the sizes tensor parallelism must divide (``model.config.spec()``); so does a Hugging
    Face model's config (heads, key/value heads, MLP width, vocabulary)."""
    dataset = job.dataset()
    if len(dataset) == 0:
        raise ConfigError("the job's dataset is empty; give it at least one sample")
    inputs, targets = default_collate([dataset[0]])
    with torch.device("meta"), SkipInPlaceOnMeta():
        meta_model = job.model()
    reference = getattr(getattr(meta_model, "config", None), "spec", None)
    known = reference() if callable(reference) else hf_model_facts(meta_model)
    return ModelSpec(
        name=job.name,
        factory=job.model,
        sample_shape=tuple(inputs.shape[1:]),
        input_dtype=inputs.dtype,
        hidden=known.hidden if known else None,
        tp_divisibility=known.tp_divisibility if known else (),
        tokens_per_sample=targets[0].numel() if targets.dim() > 1 else 1,
        loss=job.loss,
        target=(tuple(targets.shape[1:]), targets.dtype),
    )


def serves_embeddings(job: Job) -> bool:
    """Whether ``job``'s model has embedding tables worth parameter servers (the planner
    then prices them; see :mod:`unipar.plan.grad_sync`)."""
    return parameter_facts(job.model).table_share >= WORTH_SERVING_SHARE


def plan_job(
    job: Job,
    cluster: ClusterSpec,
    strategy: Strategy = Strategy.AUTO,
    *,
    consider_servers: bool = True,
) -> PlanReport:
    """The planner's report for ``job`` on all of ``cluster``'s devices."""
    constraints = constraints_for(strategy, cluster.num_devices)
    return plan(
        job_model_spec(job),
        cluster,
        job.global_batch_size,
        constraints=constraints,
        consider_servers=consider_servers,
    )
