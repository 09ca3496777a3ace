"""Cut a model into pipeline stages, whatever its forward looks like.

The layers are the planner's (:func:`unipar.analysis.profile.layer_sequence`): the
items of an ``nn.Sequential`` or ``ModuleList``, the repeated blocks of a model at any
depth (a Hugging Face model's ``model.layers`` or ``bert.encoder.layer``) and the
modules around them. A stage is a run of them, and runs the model's own forward on the
batch's inputs (every stage reads the batch: masks and positions are made where they
are used) with three changes (:class:`StageForward`):

- the layers holding parameters that other stages hold stand in as
  :class:`StandIn`: no parameters, no compute, zeros of the layer's output shape (the
  layer run on the meta device, once per input shape), so the glue code around them
  runs as it is; layers without parameters (activations, rotary tables, dropout) run on
  every stage;
- its first layer takes the previous stage's activation as its input (its first
  argument is replaced, on its one call);
- its output is the input of the next stage's first layer (taken on that layer's call),
  so code between two layers runs once, on the stage before the cut; the last stage
  returns the whole model's output, its tensors as a tuple for the schedule, rebuilt
  into the model's own type (a ``ModelOutput`` with its ``logits``) before the loss
  (:class:`PipelineLoss`).

A stage keeps its own layers under their original names, so parameter names (and so
checkpoints) are the same under every plan.

Whether the cuts compose is checked, not assumed (:func:`check_stages_compose`): on the
meta device before any worker starts (each boundary layer called once, with a tensor;
every stage runs; the last gives the whole model's output type and shapes), and with
real values on each worker before training (the stages, run one after another on a
real sample, give the whole model's output). A model that cannot be cut is refused
naming the layer and the reason.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from unipar.analysis.meta import BranchesOnMeta
from unipar.analysis.profile import layer_sequence
from unipar.data.batch import same_structure, to_meta
from unipar.errors import UnsupportedPlanError
from unipar.model_call import ModelCall
from unipar.plan import Plan

_STRATEGIES_WITHOUT_PP = "dp, fsdp and tp (plans with pp=1)"
LossFunction = Callable[[Any, Any], torch.Tensor]


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
    """A model needs at least one layer per stage, and no parameter shared by more
    than two stages."""
    layers = layer_sequence(model)
    chunks = plan.mesh.pp * plan.virtual_stages
    if len(layers) < chunks or len(layers) < 2:
        raise UnsupportedPlanError(
            f"pipeline parallel cuts the model's sequence of layers into stages, but "
            f"{type(model).__name__} has {len(layers)} layer(s) ({[n for n, _ in layers]}) "
            f"for {chunks} stages; build the model from a sequence of layers "
            f"(nn.Sequential, nn.ModuleList), or use {_STRATEGIES_WITHOUT_PP}"
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


class StandIn(nn.Identity):
    """A layer another pipeline stage holds: no parameters and no compute; returns zeros
    of the layer's output (shapes and dtypes from the layer run on the meta device, or,
    for a layer with real weights, run without gradients; once per input shape).

    A subclass of ``nn.Identity``: placeholders in a list of blocks are not blocks
    (:func:`~unipar.analysis.profile.block_list`)."""

    def __init__(self, layer: nn.Module, shapes: dict | None = None) -> None:
        """``shapes``: output shapes found so far, by layer and input shapes (shared by
        the stand-ins of one check, so each layer runs once whatever the stages)."""
        super().__init__()
        self.__dict__["_layer"] = layer  # not a submodule: its parameters are not ours
        self.__dict__["_shapes"] = {} if shapes is None else shapes

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        shapes = tuple((tuple(t.shape), t.dtype) for t in tensors)
        key = id(self._layer), shapes, len(args), tuple(kwargs)
        if key not in self._shapes:
            self._shapes[key] = self._output_like(args, kwargs)
        device = tensors[0].device if tensors else torch.device("cpu")
        return tree_map_only(
            torch.Tensor, lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device),
            self._shapes[key],
        )

    @torch.no_grad()
    def _output_like(self, args: tuple, kwargs: dict) -> Any:
        layer = self._layer
        on_meta = any(p.is_meta for p in itertools.chain(layer.parameters(), layer.buffers()))
        if not on_meta:
            return layer(*args, **kwargs)
        with BranchesOnMeta():
            return layer(*to_meta(args), **to_meta(kwargs))


def set_layer(model: nn.Module, name: str, layer: nn.Module) -> None:
    """Put ``layer`` in place of the layer called ``name``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, (nn.ModuleList, nn.Sequential)):
        parent[int(child)] = layer
    elif isinstance(parent, nn.ModuleDict):
        parent[child] = layer
    else:
        setattr(parent, child, layer)


def _stand_in_others(model: nn.Module, keep: Sequence[str], shapes: dict | None = None) -> None:
    """Replace the layers with parameters that are not in ``keep`` by stand-ins."""
    for name, layer in layer_sequence(model):
        if name not in keep and any(True for _ in layer.parameters()):
            set_layer(model, name, StandIn(layer, shapes))


def build_stage(model: nn.Module, keep: Sequence[str]) -> nn.Module:
    """A copy of ``model`` (usually on the meta device) holding only the layers
    ``keep`` (and those without parameters); :func:`attach_stage_forward` gives it its
    stage's forward once it is parallelised."""
    stage = copy.deepcopy(model)
    _stand_in_others(stage, keep)
    return stage


class _BoundaryError(Exception):
    """A cut that does not work: the message names the layer and why."""


class StageForward:
    """The forward of one pipeline stage (see the module doc): called as
    ``stage(*received, batch=inputs)``, ``received`` being the previous stage's
    activation (nothing on the first stage). ``first``: this stage's first layer
    (``None`` on the first stage); ``following``: the next stage's first layer (``None``
    on the last stage)."""

    def __init__(
        self,
        model: nn.Module,
        forward: Callable[..., Any],
        call: ModelCall,
        first: str | None,
        following: str | None,
    ) -> None:
        self.forward, self.call = forward, call
        self.first, self.following = first, following
        self._pending: torch.Tensor | None = None
        self._captured: torch.Tensor | None = None
        self._calls = {first: 0, following: 0}
        self.output_spec: Any = None  # the last stage's output: its tree and non-tensors
        self._handles = []
        if first is not None:
            self._handles.append(
                model.get_submodule(first).register_forward_pre_hook(
                    self._put_in, with_kwargs=True, prepend=True
                )
            )
        if following is not None:
            self._handles.append(
                model.get_submodule(following).register_forward_pre_hook(
                    self._take_out, with_kwargs=True, prepend=True
                )
            )

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _put_in(self, _module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self._calls[self.first] += 1
        if self._pending is None:
            return args, kwargs
        value, self._pending = self._pending, None
        if args:
            return (value, *args[1:]), kwargs
        name = _first_tensor_keyword(kwargs, self.first)
        return args, {**kwargs, name: value}

    def _take_out(self, _module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._calls[self.following] += 1
        if self._calls[self.following] == 1:
            value = args[0] if args else kwargs[_first_tensor_keyword(kwargs, self.following)]
            if not isinstance(value, torch.Tensor):
                raise _BoundaryError(
                    f"layer {self.following!r} takes a {type(value).__name__} as its first "
                    "input, not a tensor, and a stage boundary passes one tensor to the next "
                    "stage"
                )
            self._captured = value

    def __call__(self, *received: torch.Tensor, batch: Any) -> Any:
        self._calls = dict.fromkeys(self._calls, 0)
        self._pending = received[0] if received else None
        self._captured = None
        try:
            output = self.call(self.forward, batch)
        finally:
            pending, self._pending = self._pending, None
        for name, count in self._calls.items():
            if name is not None and count != 1:
                raise _BoundaryError(
                    f"layer {name!r} runs {count} times in one forward, and a stage "
                    "boundary must be a layer the forward runs once"
                )
        if pending is not None:
            raise _BoundaryError(f"the stage's input never reached layer {self.first!r}")
        if self.following is not None:
            assert self._captured is not None  # _take_out saw one call
            return self._captured
        leaves, spec = tree_flatten(output)
        constants = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
        self.output_spec = (spec, constants)
        return tuple(x for x in leaves if isinstance(x, torch.Tensor))

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> Any:
        """The last stage's output in the whole model's type, from the tensors it
        returned (:meth:`__call__`)."""
        spec, constants = self.output_spec
        given = iter(tensors)
        return tree_unflatten([next(given) if c is _TENSOR else c for c in constants], spec)


_TENSOR = object()  # where a tensor goes back into the last stage's output


def _first_tensor_keyword(kwargs: dict, layer: str | None) -> str:
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            return name
    raise _BoundaryError(f"layer {layer!r} is called without a tensor input to cut at")


def attach_stage_forward(
    stage: nn.Module, chunks: list[list[str]], index: int, call: ModelCall
) -> StageForward:
    """Give ``stage`` (built by :func:`build_stage`, then parallelised: wrappers
    included) the forward of stage ``index`` of ``chunks``."""
    run = StageForward(
        stage,
        stage.forward,
        call,
        first=chunks[index][0] if index > 0 else None,
        following=chunks[index + 1][0] if index + 1 < len(chunks) else None,
    )
    stage.forward = run
    return run


class PipelineLoss:
    """The schedule's loss: the user's ``loss`` on the last stage's output rebuilt into
    the whole model's type, and on the micro-batch's targets (any tree of tensors: the
    schedule is given micro-batch indices as its target and this looks them up)."""

    def __init__(self, loss: LossFunction, last_stage: StageForward | None) -> None:
        self.loss, self.last_stage = loss, last_stage
        self.targets: list[Any] = []

    def __call__(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        assert self.last_stage is not None
        tensors = output if isinstance(output, tuple) else (output,)
        return self.loss(self.last_stage.rebuild(tensors), self.targets[int(index[0])])


@contextlib.contextmanager
def _standing_in(model: nn.Module, keep: Sequence[str], shapes: dict) -> Iterator[None]:
    """Temporarily stand in for the layers not in ``keep`` in ``model`` itself."""
    saved = {name: layer for name, layer in layer_sequence(model)}
    _stand_in_others(model, keep, shapes)
    try:
        yield
    finally:
        for name, layer in saved.items():
            set_layer(model, name, layer)


def _stage_failure(
    model: nn.Module, chunks: list[list[str]], sample: Any, call: ModelCall, values: bool
) -> str | None:
    """Why ``chunks`` run one after another on ``sample`` do not give ``model``'s output
    (``None``: they do). ``values``: compare values too (a model with real weights)."""
    expected = call(model, sample)
    h: tuple[torch.Tensor, ...] = ()
    output: Any = None
    shapes: dict = {}
    for index, keep in enumerate(chunks):
        with _standing_in(model, keep, shapes):
            run = attach_stage_forward(model, chunks, index, call)
            try:
                out = run(*h, batch=sample)
            except _BoundaryError as error:
                return str(error)
            except Exception as error:
                return (
                    f"stage {index} (layers {keep[0]!r} to {keep[-1]!r}) raised "
                    f"{type(error).__name__}: {error}"
                )
            finally:
                run.remove()
                del model.forward
        if index + 1 < len(chunks):
            h = (out,)
        else:
            output = run.rebuild(out)
    differs = same_structure(output, expected)
    if differs:
        return f"the last stage's output is not the whole model's ({differs})"
    if values:
        for got, want in zip(tree_flatten(output)[0], tree_flatten(expected)[0], strict=True):
            if isinstance(got, torch.Tensor) and not torch.allclose(
                got, want, rtol=1e-4, atol=1e-5
            ):
                return (
                    f"the stages' output differs from the whole model's by "
                    f"{(got - want).abs().max().item():.3g}: an input of a later stage's "
                    "layers comes from an earlier stage's layer by another way than the "
                    "boundary (a skip connection across the cut)"
                )
    return None


@torch.no_grad()
def check_stages_compose(
    model: nn.Module, chunks: list[list[str]], sample: Any, call: ModelCall
) -> None:
    """Refuse ``chunks`` if the stages, run one after another on ``sample``, do not
    give ``model``'s output: on the meta device its type and shapes, with real weights
    its values too (the model is left as it was)."""
    if len(chunks) < 2:
        return
    meta = any(p.is_meta for p in model.parameters())
    was_training = model.training
    model.eval()
    try:
        with BranchesOnMeta() if meta else contextlib.nullcontext():
            failure = _stage_failure(model, chunks, to_meta(sample) if meta else sample, call,
                                     values=not meta)
    finally:
        model.train(was_training)
    if failure is not None:
        starts = [chunk[0] for chunk in chunks[1:]]
        raise UnsupportedPlanError(
            f"pipeline parallel cannot cut {type(model).__name__} into stages starting at "
            f"layers {starts}: {failure}. Each stage runs the model's forward with the other "
            "stages' layers standing in; the forward must run its layers in order, each "
            "boundary layer once, taking the previous stage's activation as its input. "
            f"Choose other stage boundaries, or use {_STRATEGIES_WITHOUT_PP}"
        )
