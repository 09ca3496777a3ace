"""Cut a model into pipeline stages by removing the layers other stages hold.

The layers are the planner's: top-level children in definition order, with
``ModuleList`` / ``ModuleDict`` / ``Sequential`` containers expanded
(:func:`unipar.analysis.profile.layer_sequence`). A stage is a copy of the model that
keeps its own layers under their original names, so parameter names (and so
checkpoints) are the same under every plan. A removed layer becomes ``None`` (a
top-level child, which the model's ``forward`` skips, the torchtitan convention) or
is deleted (an item of a ``ModuleDict``, whose loop then does not visit it) or becomes
``nn.Identity`` (an item of a ``ModuleList`` / ``Sequential``, which keeps the indices
of the others).

Whether a model's ``forward`` tolerates this is checked, not assumed:
:func:`check_stages_compose` runs the stages one after the other on a real sample and
compares the result with the whole model's.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator, Sequence

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


def set_layer(model: nn.Module, name: str, layer: nn.Module | None) -> None:
    """Put ``layer`` in place of the layer called ``name``; ``None`` removes it (see the
    module docstring for what removal means in each kind of container)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, nn.ModuleDict):
        if layer is None:
            del parent[child]
        else:
            parent[child] = layer
    elif isinstance(parent, (nn.ModuleList, nn.Sequential)):
        parent[int(child)] = nn.Identity() if layer is None else layer
    else:
        setattr(parent, child, layer)


def _remove(model: nn.Module, name: str) -> None:
    set_layer(model, name, None)


def build_stage(model: nn.Module, keep: Sequence[str]) -> nn.Module:
    """A deep copy of ``model`` (usually on the meta device) holding only ``keep``."""
    stage = copy.deepcopy(model)
    for name, _ in layer_sequence(model):
        if name not in keep:
            _remove(stage, name)
    return stage


@contextlib.contextmanager
def _only(model: nn.Module, keep: Sequence[str]) -> Iterator[None]:
    """Temporarily remove the layers not in ``keep`` from ``model`` itself (no copy)."""
    saved = []
    for name, _ in layer_sequence(model):
        if name not in keep:
            parent_name = name.rpartition(".")[0]
            parent = model.get_submodule(parent_name) if parent_name else model
            saved.append((parent, dict(parent._modules)))
            _remove(model, name)
    try:
        yield
    finally:
        for parent, modules in reversed(saved):
            parent._modules.clear()
            parent._modules.update(modules)


@torch.no_grad()
def check_stages_compose(model: nn.Module, stages: list[list[str]], sample: torch.Tensor) -> None:
    """Run the stages of ``model`` one after another on ``sample`` and require the whole
    model's output: the proof that the model's ``forward`` skips removed layers."""
    was_training = model.training
    model.eval()
    try:
        expected = model(sample)
        h = sample
        for index, keep in enumerate(stages):
            with _only(model, keep):
                try:
                    h = model(h)
                except Exception as error:
                    raise UnsupportedPlanError(
                        f"pipeline stage {index} (layers {keep[0]}..{keep[-1]}) of "
                        f"{type(model).__name__} failed with {type(error).__name__}: {error}. "
                        "Pipeline parallel runs the model's forward with the other stages' "
                        "layers removed (top-level layers set to None); its forward must skip "
                        "a layer that is None (`if self.norm is not None: ...`) and take the "
                        f"previous stage's output as input. Otherwise use {_STRATEGIES_WITHOUT_PP}"
                    ) from error
    finally:
        model.train(was_training)
    if h.shape != expected.shape or not torch.allclose(h, expected, rtol=1e-4, atol=1e-5):
        raise UnsupportedPlanError(
            f"running {type(model).__name__}'s {len(stages)} pipeline stages one after another "
            "does not give the whole model's output (largest difference "
            f"{_difference(h, expected)}): its forward does more than run its layers in "
            f"sequence (e.g. combines two layers' outputs). Use {_STRATEGIES_WITHOUT_PP}"
        )


def _difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"{(a - b).abs().max().item():.3g}"
