"""Cut a model into pipeline stages by removing the layers other stages hold.

The layers are the planner's: top-level children in definition order, with
``ModuleList`` / ``ModuleDict`` / ``Sequential`` containers expanded
(:func:`unipar.analysis.profile.layer_sequence`). A stage is a copy of the model that
keeps its own layers under their original names, so parameter names (and so
checkpoints) are the same under every plan. A removed item of a ``ModuleDict`` is
deleted (its loop then does not visit it); of a ``ModuleList`` / ``Sequential``, it
becomes ``nn.Identity`` (keeping the others' indices). A removed top-level layer
becomes ``None`` (the torchtitan convention: ``forward`` skips it) or, for a model
whose ``forward`` calls it unconditionally, ``nn.Identity`` (it passes the previous
stage's activations through).

Which of the two a model's ``forward`` takes is found out, not assumed:
:func:`removal_for` runs the stages one after the other on a real sample and keeps
the first way that gives the whole model's output.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator, Sequence
from enum import Enum

import torch
from torch import nn

from unipar.analysis.profile import layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan

_STRATEGIES_WITHOUT_PP = "dp, fsdp and tp (plans with pp=1)"


def stage_layer_names(model: nn.Module, plan: Plan) -> list[list[str]]:
    """The layer names of each of the plan's ``pp * virtual_stages`` stages, in order."""
    names = [name for name, _ in layer_sequence(model)]
    chunks = plan.mesh.pp * plan.virtual_stages
    bounds = [0, *plan.stage_boundaries, len(names)]
    if len(bounds) != chunks + 1 or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise UnsupportedPlanError(
            f"the plan's stage_boundaries {list(plan.stage_boundaries)} must cut the model's "
            f"{len(names)} layers into pp x virtual_stages = {chunks} non-empty stages; "
            f"give {chunks - 1} increasing layer indices between 1 and {len(names) - 1}"
        )
    return [names[a:b] for a, b in itertools.pairwise(bounds)]


def stage_indices(plan: Plan, pp_rank: int) -> list[int]:
    """Stages held by pipeline rank ``pp_rank``: stage ``k`` lives on rank ``k mod pp``
    (the looped placement of interleaved 1F1B, Narayanan et al. 2021, Sec. 2.2)."""
    return list(range(pp_rank, plan.mesh.pp * plan.virtual_stages, plan.mesh.pp))


def check_pipeline_layers(model: nn.Module, plan: Plan) -> None:
    """A model needs at least one layer per stage, and no parameter shared across stages."""
    layers = layer_sequence(model)
    chunks = plan.mesh.pp * plan.virtual_stages
    if len(layers) < chunks or len(layers) < 2:
        raise UnsupportedPlanError(
            f"pipeline parallel cuts the model's sequence of layers into stages, but "
            f"{type(model).__name__} has {len(layers)} layer(s) ({[n for n, _ in layers]}) "
            f"for {chunks} stages; build the model from a list of repeated blocks "
            f"(nn.ModuleList / nn.ModuleDict), or use {_STRATEGIES_WITHOUT_PP}"
        )
    stage_of = {}
    for stage, names in enumerate(stage_layer_names(model, plan)):
        for name in names:
            stage_of[name] = stage
    owners: dict[int, str] = {}
    for layer_name, layer in layers:
        for param in layer.parameters():
            first = owners.setdefault(id(param), layer_name)
            if stage_of[first] != stage_of[layer_name]:
                raise UnsupportedPlanError(
                    f"layers {first!r} and {layer_name!r} share a parameter (tied weights), "
                    f"but the plan puts them in stages {stage_of[first]} and "
                    f"{stage_of[layer_name]}; untie them, or use {_STRATEGIES_WITHOUT_PP}"
                )


class Removal(Enum):
    """What a removed top-level layer becomes."""

    NONE = "none"
    IDENTITY = "identity"


def set_layer(model: nn.Module, name: str, layer: nn.Module | None) -> None:
    """Put ``layer`` in place of the layer called ``name``; ``None`` removes it from a
    container (deleted from a ``ModuleDict``, ``nn.Identity`` in a list)."""
    parent, child = _parent(model, name)
    if isinstance(parent, nn.ModuleDict):
        if layer is None:
            del parent[child]
        else:
            parent[child] = layer
    elif isinstance(parent, (nn.ModuleList, nn.Sequential)):
        parent[int(child)] = nn.Identity() if layer is None else layer
    else:
        setattr(parent, child, layer)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding layer ``name``, and the layer's name within it."""
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def _remove(model: nn.Module, name: str, removal: Removal) -> None:
    top_level = "." not in name
    replacement = nn.Identity() if top_level and removal is Removal.IDENTITY else None
    set_layer(model, name, replacement)


def build_stage(model: nn.Module, keep: Sequence[str], removal: Removal) -> nn.Module:
    """A deep copy of ``model`` (usually on the meta device) holding only ``keep``."""
    stage = copy.deepcopy(model)
    for name, _ in layer_sequence(model):
        if name not in keep:
            _remove(stage, name, removal)
    return stage


@contextlib.contextmanager
def _only(model: nn.Module, keep: Sequence[str], removal: Removal) -> Iterator[None]:
    """Temporarily remove the layers not in ``keep`` from ``model`` itself (no copy)."""
    saved = []
    for name, _ in layer_sequence(model):
        if name not in keep:
            parent, _ = _parent(model, name)
            saved.append((parent, dict(parent._modules)))
            _remove(model, name, removal)
    try:
        yield
    finally:
        for parent, modules in reversed(saved):
            parent._modules.clear()
            parent._modules.update(modules)


@torch.no_grad()
def removal_for(model: nn.Module, stages: list[list[str]], sample: torch.Tensor) -> Removal:
    """How to remove layers from ``model`` so that its ``stages``, run one after another
    on ``sample``, give the whole model's output; a clear error if no way does."""
    was_training = model.training
    model.eval()
    try:
        expected = model(sample)
        failures = []
        for removal in Removal:
            failure = _compose_failure(model, stages, sample, expected, removal)
            if failure is None:
                return removal
            failures.append(f"with removed layers set to {removal.value}: {failure}")
    finally:
        model.train(was_training)
    raise UnsupportedPlanError(
        f"pipeline parallel runs {type(model).__name__}'s forward once per stage with the "
        "other stages' layers removed, but its stages do not compose into the whole model ("
        + "; ".join(failures)
        + "). Its forward must run its layers in sequence, taking the previous stage's "
        "output as input, and skip a removed layer (`if self.norm is not None`) or pass "
        f"through it. Otherwise use {_STRATEGIES_WITHOUT_PP}"
    )


def _compose_failure(
    model: nn.Module,
    stages: list[list[str]],
    sample: torch.Tensor,
    expected: torch.Tensor,
    removal: Removal,
) -> str | None:
    h = sample
    for index, keep in enumerate(stages):
        with _only(model, keep, removal):
            try:
                h = model(h)
            except Exception as error:
                return f"stage {index} raised {type(error).__name__}: {error}"
    if h.shape != expected.shape or not torch.allclose(h, expected, rtol=1e-4, atol=1e-5):
        return f"output differs ({_difference(h, expected)})"
    return None


def _difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"{(a - b).abs().max().item():.3g}"
