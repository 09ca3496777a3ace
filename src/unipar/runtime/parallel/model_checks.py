"""Whether a model can take a plan, checked on the model alone (the meta device is
enough, nothing distributed): what the preflight asks before any worker starts. Apart
from :mod:`unipar.runtime.parallel.parallelize`, so that the driver's preflight does not
import what applying a plan needs (DTensor, FSDP: about 0.5 s of a run's start)."""

from __future__ import annotations

from typing import Any

from torch import nn

from unipar.errors import UnsupportedPlanError
from unipar.model_call import ModelCall
from unipar.plan import Plan
from unipar.runtime.parallel import stages as stage_cuts
from unipar.runtime.parallel.tensor import tensor_parallel_roles


def check_plan_for_model(
    model: nn.Module, plan: Plan, sample: Any = None, call: ModelCall = ModelCall.POSITIONAL
) -> None:
    """Raise :class:`UnsupportedPlanError` if ``model`` (on any device, the meta device
    is enough) cannot take ``plan``. Nothing distributed is needed. ``sample``: a batch
    of inputs (taken ``call``'s way), on which pipeline stages are run one after another
    (on the meta device: types and shapes) to check that they compose."""
    if plan.mesh.tp > 1:
        _check_ties_sharded_alike(model, tensor_parallel_roles(model, plan))
    if plan.mesh.pp > 1:
        stage_cuts.check_pipeline_layers(model, plan)
        if sample is not None:
            chunks = stage_cuts.stage_layer_names(model, plan)
            stage_cuts.check_stages_compose(model, chunks, sample, call)


def _check_ties_sharded_alike(model: nn.Module, roles: dict[str, str]) -> None:
    """A tied parameter stays one tensor (or, split across pipeline stages, copies
    summed element by element), so tensor parallel must shard its users alike."""
    for names in stage_cuts.tied_parameters(model):
        owners = [name.rpartition(".")[0] for name in names]
        styles = {role.value if (role := roles.get(owner)) else "replicate" for owner in owners}
        if len(styles) > 1:
            raise UnsupportedPlanError(
                f"layers {owners} share a parameter (tied weights), but the plan's tensor "
                f"parallel splits them differently ({sorted(styles)}); give them the same "
                "tensor-parallel style (the planner splits both along the vocabulary)"
            )
