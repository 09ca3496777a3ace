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
stage's activations through). A removed block is a :class:`PassThrough`, which takes
any call signature (a Hugging Face decoder layer is called with masks and positions).

A Hugging Face model's blocks sit deeper (``model.layers``, ``transformer.h``); its
stage (the model itself, or the user's model holding it) runs the model's own forward
(:func:`unipar.models.hf.stage_forward`) with the other stages' layers replaced:
embeddings by zeros, the rest by pass-throughs, and parameter-free modules holding
tables (rotary embeddings) kept on every stage.

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

from unipar.analysis.profile import block_list, layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.models import hf
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
    for tie in cross_stage_ties(model, plan):
        if len(tie) != 2:
            raise UnsupportedPlanError(
                f"parameters {[name for _, name in tie]} are one tensor (tied weights) held "
                f"by {len(tie)} pipeline stages {[stage for stage, _ in tie]}; the runtime "
                f"keeps a tie in sync between two stages only: untie them, choose stage "
                f"boundaries that keep them on at most two stages, or use "
                f"{_STRATEGIES_WITHOUT_PP}"
            )


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one tensor (tied weights, e.g. GPT-2's
    ``transformer.wte.weight`` and ``lm_head.weight``), found before any sharding."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def cross_stage_ties(model: nn.Module, plan: Plan) -> list[list[tuple[int, str]]]:
    """Tied parameters the plan's stages hold more than one copy of: for each, the
    stages holding it with the name it has there (each stage keeps its own copy,
    their gradients summed every step, as Megatron-LM does for the word embedding)."""
    stage_of = {
        name: stage for stage, names in enumerate(stage_layer_names(model, plan)) for name in names
    }
    ties = []
    for names in tied_parameters(model):
        holders: dict[int, str] = {}
        for name in names:
            layer = next((layer for layer in stage_of if name.startswith(f"{layer}.")), None)
            if layer is not None:  # else held by a module around the layers, on every stage
                holders.setdefault(stage_of[layer], name)
        if len(holders) > 1:
            ties.append(sorted(holders.items()))
    return ties


class Removal(Enum):
    """What a removed top-level layer becomes."""

    NONE = "none"
    IDENTITY = "identity"
    HUGGING_FACE = "hugging_face"  # see the module docstring


class PassThrough(nn.Identity):
    """A removed block: returns its first argument, whatever else it is called with."""

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x


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
        parent[int(child)] = PassThrough() if layer is None else layer
    else:
        setattr(parent, child, layer)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding layer ``name``, and the layer's name within it."""
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _removed(layer: nn.Module, in_container: bool, removal: Removal) -> nn.Module | None:
    """What replaces a removed layer (``None``: taken out, see :func:`set_layer`)."""
    if in_container:
        return None
    if removal is Removal.HUGGING_FACE:
        if isinstance(layer, nn.Embedding):
            return hf.ZeroEmbedding(layer.embedding_dim, layer.weight.dtype)
        return PassThrough()
    return nn.Identity() if removal is Removal.IDENTITY else None


def _kept_everywhere(layer: nn.Module, removal: Removal) -> bool:
    """Parameter-free tables (a Hugging Face model's rotary embedding, called by its
    forward on every stage) stay on every stage."""
    parameter_free = not any(True for _ in layer.parameters())
    return removal is Removal.HUGGING_FACE and parameter_free and any(True for _ in layer.buffers())


def _remove_others(model: nn.Module, keep: Sequence[str], removal: Removal) -> None:
    """Replace the layers not in ``keep`` (see :func:`_removed`), in place."""
    for name, layer in layer_sequence(model):
        if name not in keep and not _kept_everywhere(layer, removal):
            parent, _ = _parent(model, name)
            set_layer(model, name, _removed(layer, isinstance(parent, _CONTAINERS), removal))


def _hf_root(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The outermost Hugging Face model holding the blocks (``model`` itself, or one
    inside the user's model), with its path; ``None`` if there is none."""
    path = block_list(model)
    parts = path.split(".")[:-1] if path else []
    for depth in range(len(parts) + 1):
        prefix = ".".join(parts[:depth])
        module = model.get_submodule(prefix) if prefix else model
        if hf.is_hf_model(module):
            return prefix, module
    return None


def _run_as_stage(model: nn.Module, removal: Removal) -> nn.Module | None:
    """Give the Hugging Face model in ``model`` its stage forward; returns it."""
    root = _hf_root(model) if removal is Removal.HUGGING_FACE else None
    if root is None:
        return None
    prefix, module = root
    module.forward = hf.stage_forward(module.forward, outermost=not prefix)
    return module


def build_stage(model: nn.Module, keep: Sequence[str], removal: Removal) -> nn.Module:
    """A deep copy of ``model`` (usually on the meta device) holding only ``keep``."""
    stage = copy.deepcopy(model)
    _remove_others(stage, keep, removal)
    _run_as_stage(stage, removal)
    return stage


@contextlib.contextmanager
def _only(model: nn.Module, keep: Sequence[str], removal: Removal) -> Iterator[None]:
    """Temporarily remove the layers not in ``keep`` from ``model`` itself (no copy)."""
    saved = [(parent, dict(parent._modules)) for parent in _parents(model)]
    _remove_others(model, keep, removal)
    staged = _run_as_stage(model, removal)
    try:
        yield
    finally:
        if staged is not None:
            del staged.forward
        for parent, modules in reversed(saved):
            parent._modules.clear()
            parent._modules.update(modules)


def _parents(model: nn.Module) -> list[nn.Module]:
    """Every module holding a layer, each once."""
    parents: dict[int, nn.Module] = {}
    for name, _ in layer_sequence(model):
        parent, _ = _parent(model, name)
        parents.setdefault(id(parent), parent)
    return list(parents.values())


@torch.no_grad()
def removal_for(model: nn.Module, stages: list[list[str]], sample: torch.Tensor) -> Removal:
    """How to remove layers from ``model`` so that its ``stages``, run one after another
    on ``sample``, give the whole model's output; a clear error if no way does."""
    was_training = model.training
    model.eval()
    candidates = [Removal.HUGGING_FACE] if _hf_root(model) else [Removal.NONE, Removal.IDENTITY]
    try:
        expected = hf.output_tensor(model(sample))
        failures = []
        for removal in candidates:
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
