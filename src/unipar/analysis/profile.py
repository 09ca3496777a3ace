"""Analyse a model on the meta device: per layer, in execution order, what one sample
costs. Nothing is allocated, so a trillion-parameter model is analysed on a laptop.

One forward pass on meta tensors is observed at the ATen level:
- matrix products (every op PyTorch's FLOP counter knows) give forward FLOPs;
- every other op that writes new memory (not a view) gives bytes moved (inputs read,
  output written), the traffic of memory-bound kernels;
- tensors autograd saves for backward (parameters excluded, shared storage counted
  once) give the activation memory;
- a layer's output gives what a pipeline boundary after it would send.
Backward is taken as twice the forward in FLOPs and bytes (Narayanan et al. 2021, Sec. 5.1).

The meta device runs attention by its math path, which materialises the scores
(``seq x seq`` per head). Given the sequence length, the attention core (the products
that make or read scores, and the ops and saved tensors of score shape) is recorded
apart, so the cost model can cost it as the target device runs it (a fused, flash
kernel stores no scores: Dao et al. 2022).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import flop_registry

from unipar.analysis.meta import NotCompiled, branch_on_meta, build_on_meta
from unipar.errors import ConfigError
from unipar.model_call import ModelCall

_VIEW_LIKE = {"_unsafe_view", "alias", "detach"}
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


class LayerKind(Enum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"
    OTHER = "other"


@dataclass(frozen=True)
class LayerProfile:
    """Costs of one layer for one sample; elements, not bytes (the dtype is the plan's).

    ``matmuls`` lists each matrix product with the activation elements it reads and
    writes (which grow with the batch) and the weight elements it reads (which do not).

    ``*_sharded`` parts split under tensor parallelism; ``*_replicated`` parts act on
    tensors of the model's full hidden width, which Megatron-style tensor parallelism
    keeps whole on every rank (Korthikanti et al. 2022, Sec. 4.2).
    """

    name: str
    kind: LayerKind
    params: int
    forward_flops: float
    matmuls: tuple[tuple[float, float, float], ...]  # (FLOPs, activation elems, weight elems)
    matmul_ops: int
    memory_ops: int
    moved_elems_sharded: float
    moved_elems_replicated: float
    saved_elems_sharded: float
    saved_elems_replicated: float
    output_elems: float
    splittable_modules: int = 0  # nn.Linear and nn.Embedding inside: what tp splits
    param_tensors: int = 0  # parameter tensors it owns (a tied one counts in its first layer)
    # The attention core, apart from the fields above (zero where none was seen).
    attention_matmuls: tuple[tuple[float, float, float], ...] = ()
    attention_moved_elems: float = 0.0  # memory-bound ops on scores (mask, softmax, dropout)
    attention_saved_elems: float = 0.0  # scores saved for backward
    attention_kv_elems: float = 0.0  # keys and values read by the attention core

    @functools.cached_property
    def attention_flops(self) -> float:
        return sum(flops for flops, _, _ in self.attention_matmuls)


@dataclass(frozen=True)
class ModelProfile:
    layers: tuple[LayerProfile, ...]
    hidden: int | None
    tp_divisibility: tuple[tuple[str, int], ...]  # (what, size) tp must divide
    causal_attention: bool = True  # a decoder's attention: a fused kernel skips half
    attention_seq: int | None = None  # the sequence length the attention core was told by

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def has_attention(self) -> bool:
        return any(layer.attention_matmuls for layer in self.layers)

    @functools.cached_property
    def num_blocks(self) -> int:
        return sum(layer.kind is LayerKind.BLOCK for layer in self.layers)


def layer_sequence(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's layers in definition order: the repeated blocks (:func:`block_list`,
    at any depth) one by one, and around them the children of each module on the way
    down to the blocks; containers (``ModuleList``, ``ModuleDict``, ``Sequential``)
    are expanded into their items. For blocks at the top level (unipar's own models),
    these are the top-level children with containers expanded; for a Hugging Face
    ``LlamaForCausalLM``: ``model.embed_tokens``, ``model.layers.0`` ...,
    ``model.norm``, ``model.rotary_emb``, ``lm_head``."""
    path = block_list(model)
    descend = path.split(".")[:-1] if path else []
    layers: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module, depth: int) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if depth < len(descend) and name == descend[depth]:
                visit(f"{full}.", child, depth + 1)
            elif isinstance(child, _CONTAINERS):
                layers.extend((f"{full}.{sub}", item) for sub, item in child.named_children())
            else:
                layers.append((full, child))

    visit("", model, 0)
    return layers


def block_list(model: nn.Module) -> str | None:
    """The path of the longest ``ModuleList`` / ``Sequential`` of two or more blocks of
    one type holding parameters, at any depth (the shallowest of equal ones); ``None``
    if there is none. ``nn.Identity`` items are placeholders for blocks another
    pipeline stage holds."""
    best, best_length = None, 1
    for name, module in model.named_modules():
        if not name or not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        items = [item for item in module if not isinstance(item, nn.Identity)]
        same_type = len({type(item) for item in items}) == 1
        with_parameters = all(any(True for _ in item.parameters()) for item in items)
        if same_type and with_parameters and len(module) > best_length:
            best, best_length = name, len(module)
    return best


def layer_kind(module: nn.Module, index: int, count: int) -> LayerKind:
    if isinstance(module, nn.Embedding) or _embeddings_only(module):
        return LayerKind.EMBEDDING
    if index == count - 1 and isinstance(module, nn.Linear):
        return LayerKind.HEAD
    if sum(1 for _ in module.parameters()) > 4 and any(True for _ in module.children()):
        return LayerKind.BLOCK
    return LayerKind.OTHER


def _embeddings_only(module: nn.Module) -> bool:
    """A layer of embedding tables and norms only (BERT's word, position and token type
    embeddings with their LayerNorm): an embedding layer, not a block."""
    holders = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    embeddings = [m for m in holders if isinstance(m, nn.Embedding)]
    norms = [m for m in holders if type(m).__name__.endswith(("Norm", "LayerNorm"))]
    return bool(embeddings) and len(embeddings) + len(norms) == len(holders)


def is_attention_scores(t: object, seq: int | None) -> bool:
    """A tensor of attention scores: ``[..., seq, seq]`` with heads (or batch x heads)
    in front, so a ``[1, seq, hidden]`` activation with ``hidden == seq`` is not one."""
    if seq is None or not isinstance(t, torch.Tensor) or t.dim() < 3:
        return False
    return tuple(t.shape[-2:]) == (seq, seq) and t.shape[:-2].numel() > 1


class _Recorder(NotCompiled):
    def __init__(self, hidden: int | None, seq: int | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        self.seq = seq
        self.attention: dict[str, list[tuple[float, float, float]]] = {}
        # Storages copied from a broadcast (expanded) view, with the elements behind it:
        # grouped-query attention repeats keys and values for the math path; a fused
        # kernel and the context-parallel ring pass the unrepeated ones.
        self.repeated: dict[int, int] = {}
        self.parameter_bytes = 4  # element size of the model's floating-point parameters
        self.current: str | None = None
        self.stats: dict[str, dict[str, float]] = {}
        self.matmuls: dict[str, list[tuple[float, float, float]]] = {}
        self.parameter_storages: set[int] = set()

    def is_parameter(self, t: torch.Tensor) -> bool:
        return t.untyped_storage()._cdata in self.parameter_storages

    def width(self, t: object) -> float:
        """Elements of ``t`` in units of the parameters' width: a float32 tensor of a
        bfloat16 model (an upcast norm, rotary embedding or loss) counts twice, as it
        moves twice the bytes; in a float32 model every float tensor counts once. Used
        for the traffic of memory-bound ops; saved activations are counted at the
        training width."""
        if not isinstance(t, torch.Tensor):
            return 0
        if not t.is_floating_point():
            return t.numel()
        return t.numel() * t.element_size() / self.parameter_bytes

    def _note_repeat(self, args: object, out: object) -> None:
        """Remember an output copied from a broadcast view (``expand`` then a copy, as
        ``repeat_interleave`` and Hugging Face's ``repeat_kv`` do), or computed element by
        element from such a copy (the math path's scaling of keys)."""
        if not isinstance(out, torch.Tensor):
            return
        for t in torch.utils._pytree.tree_leaves(args):
            if not isinstance(t, torch.Tensor) or t.numel() != out.numel():
                continue
            behind = self.repeated.get(t.untyped_storage()._cdata, _storage_elems(t))
            if 0 < behind < out.numel():
                self.repeated[out.untyped_storage()._cdata] = behind
                return

    def _bucket(self) -> dict[str, float]:
        name = self.current or "<top>"
        return self.stats.setdefault(name, dict.fromkeys(_FIELDS, 0.0))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if branch_on_meta(func, args):
            return True
        out = func(*args, **kwargs)
        bucket = self._bucket()
        packet = func.overloadpacket
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
            leaves = [t for t in torch.utils._pytree.tree_leaves((args, out)) if _is_tensor(t)]
            weights = sum(t.numel() for t in leaves if self.is_parameter(t))
            moved = sum(t.numel() for t in leaves) - weights
            scores = any(is_attention_scores(t, self.seq) for t in leaves)
            target = self.attention if scores else self.matmuls
            target.setdefault(self.current or "<top>", []).append((flops, moved, weights))
            if scores and len(leaves) > 1:  # the second operand of q @ k^T, p @ v: k, v
                kv = leaves[1]
                bucket["kv"] += self.repeated.get(kv.untyped_storage()._cdata, kv.numel())
            bucket["flops"] += flops
            bucket["matmul_ops"] += 1
            return out
        returns = func._schema.returns
        if not returns or returns[0].alias_info is not None or packet.__name__ in _VIEW_LIKE:
            return out
        self._note_repeat(args, out)
        width = self.width
        if packet.__name__ == "embedding":  # a gather reads only the rows it returns
            moved = 2 * width(out)
        else:
            moved = sum(width(t) for t in torch.utils._pytree.tree_leaves((args, kwargs, out)))
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        replicated = bool(outputs) and outputs[0].dim() > 0 and outputs[0].shape[-1] == self.hidden
        if outputs and _is_mask_or_scores(outputs[0], self.seq):
            bucket["attention_moved"] += moved
        else:
            bucket["moved_replicated" if replicated else "moved_sharded"] += moved
        bucket["memory_ops"] += 1
        return out


def _storage_elems(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // max(1, t.element_size())


_FIELDS = (
    "flops",
    "matmul_ops",
    "memory_ops",
    "moved_sharded",
    "moved_replicated",
    "saved_sharded",
    "saved_replicated",
    "output",
    "kv",
    "attention_moved",
    "attention_saved",
)


def _is_mask_or_scores(t: torch.Tensor, seq: int | None) -> bool:
    """Scores, or the ``[seq, seq]`` causal mask the math path builds for them."""
    mask = seq is not None and t.dim() == 2 and tuple(t.shape) == (seq, seq)
    return mask or is_attention_scores(t, seq)


def _is_tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


def analyze(
    model: nn.Module | Callable[[], nn.Module],
    sample_input: Callable[[], Any] | torch.Size | tuple[int, ...],
    *,
    input_dtype: torch.dtype = torch.long,
    hidden: int | None = None,
    tp_divisibility: tuple[tuple[str, int], ...] = (),
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    target: tuple[tuple[int, ...], torch.dtype] | Callable[[], Any] | None = None,
    attention_seq: int | None = None,
    causal_attention: bool = True,
    call: ModelCall = ModelCall.POSITIONAL,
) -> ModelProfile:
    """Profile ``model`` (a module built on the meta device, left as it was, or a factory
    to build one) on one sample of shape ``sample_input`` (batch of 1), or on the inputs
    ``sample_input()`` returns (any tree of tensors, batch of 1), passed as ``call`` says.

    ``hidden``: the model's residual width, which tells replicated from sharded
    tensors under tensor parallelism (``None``: everything counts as sharded).
    ``loss`` with ``target`` (one target's shape and dtype, or a factory of one
    sample's targets): the training loss, whose ops are counted with the last layer,
    as the step runs them after it.
    ``attention_seq``: the sequence length, which tells attention scores (``seq x seq``)
    apart (``None``: no attention core is told apart); ``causal_attention``: whether
    attention is causal (a fused kernel computes half the scores).
    """
    if not isinstance(model, nn.Module):
        model = build_on_meta(model)
    with torch.device("meta"):
        if callable(sample_input):
            inputs = sample_input()
        else:
            inputs = torch.zeros((1, *sample_input), dtype=input_dtype)
    sequence = layer_sequence(model)
    if not sequence:
        raise ConfigError(f"{type(model).__name__} has no child modules to analyse as layers")
    recorder = _Recorder(hidden, attention_seq)
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    recorder.parameter_storages = param_storages
    widths = [p.element_size() for p in model.parameters() if p.is_floating_point()]
    recorder.parameter_bytes = min(widths, default=4)
    seen_storages: set[int] = set()
    names = {id(module): name for name, module in sequence}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in param_storages and key not in seen_storages:
            seen_storages.add(key)
            bucket = recorder._bucket()
            replicated = t.dim() > 0 and t.shape[-1] == hidden
            if is_attention_scores(t, attention_seq):
                bucket["attention_saved"] += t.numel()
            else:
                bucket["saved_replicated" if replicated else "saved_sharded"] += t.numel()
        return t

    first_of, memo_handles = _memoize_repeats(sequence, recorder)

    def enter(module: nn.Module, _args: object) -> None:
        recorder.current = names[id(module)]

    def leave(module: nn.Module, _args: object, output: object) -> None:
        if isinstance(output, torch.Tensor) and recorder.current not in first_of:
            recorder._bucket()["output"] = output.numel()

    handles = []
    for _, module in sequence:
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), recorder:
            outputs = call(model, inputs)
            if loss is not None and target is not None:
                loss(outputs, _meta_targets(target))
    finally:
        for handle in handles + memo_handles:
            handle.remove()
        for _, module in sequence:  # the model is left as it was built
            module.__dict__.pop("forward", None)
    for name, first in first_of.items():
        # Skipped as a repeat: the first one's costs, which include what ran under its
        # name outside it (e.g. a residual add in the parent's forward after it returned)
        # and so replace what was recorded under the repeat's name.
        recorder.stats[name] = dict(recorder.stats[first])
        recorder.matmuls[name] = list(recorder.matmuls.get(first, []))
        recorder.attention[name] = list(recorder.attention.get(first, []))
    profile = _profile(sequence, recorder, hidden, tp_divisibility)
    return replace(profile, causal_attention=causal_attention, attention_seq=attention_seq)


def _meta_targets(target: tuple[tuple[int, ...], torch.dtype] | Callable[[], Any]) -> Any:
    """One sample's targets on the meta device."""
    with torch.device("meta"):
        if callable(target):
            return target()
        shape, dtype = target
        return torch.zeros((1, *shape), dtype=dtype)


def _signature(module: nn.Module) -> tuple:
    shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters())
    return type(module).__qualname__, repr(module), shapes


def _memoize_repeats(
    sequence: list[tuple[str, nn.Module]], recorder: _Recorder
) -> tuple[dict[str, str], list[torch.utils.hooks.RemovableHandle]]:
    """Layers identical to an earlier one (class, configuration, parameter shapes) are not
    traced again when their input has the first one's shape and the first one returned
    that same shape (a residual block): they pass their input through and take the first
    one's costs. Tracing meta tensors costs ~1 ms per op, so a 128-block model is
    analysed as fast as a 1-block one. Returns {repeat name: first name} and the hooks to
    remove afterwards (the caller also drops the patched ``forward`` attributes)."""
    first_by_signature: dict[tuple, str] = {}
    shapes: dict[str, tuple[torch.Size, torch.Size]] = {}
    repeats: dict[str, str] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def remember(name: str):  # type: ignore[no-untyped-def]
        def hook(_module: nn.Module, args: tuple, output: object) -> None:
            if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
                shapes[name] = (args[0].shape, output.shape)

        return hook

    for name, module in sequence:
        signature = _signature(module)
        if signature not in first_by_signature:
            first_by_signature[signature] = name
            handles.append(module.register_forward_hook(remember(name)))
            continue
        first = first_by_signature[signature]
        repeats[name] = first
        original = module.forward

        def forward(x, *args, _original=original, _first=first, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            seen = shapes.get(_first)
            if isinstance(x, torch.Tensor) and seen and seen[0] == seen[1] == x.shape:
                return x
            repeats.pop(_name, None)  # not a pass-through: trace it for real
            return _original(x, *args, **kwargs)

        module.forward = forward
    return repeats, handles


def _profile(sequence, recorder, hidden, tp_divisibility) -> ModelProfile:  # type: ignore[no-untyped-def]
    stats = recorder.stats
    top = stats.pop("<top>", None)
    layers = []
    counted: set[int] = set()  # a shared (tied) parameter belongs to its first layer
    for index, (name, module) in enumerate(sequence):
        own = [p for p in module.parameters() if id(p) not in counted]
        counted.update(id(p) for p in own)
        s = stats.get(name, dict.fromkeys(_FIELDS, 0.0))
        if top is not None and index == 0:  # glue code in the model's own forward
            s = {key: s[key] + (top[key] if key != "output" else 0) for key in _FIELDS}
        layers.append(
            LayerProfile(
                name=name,
                kind=layer_kind(module, index, len(sequence)),
                params=sum(p.numel() for p in own),
                forward_flops=s["flops"],
                matmuls=tuple(recorder.matmuls.get(name, ())),
                matmul_ops=int(s["matmul_ops"]),
                memory_ops=int(s["memory_ops"]),
                moved_elems_sharded=s["moved_sharded"],
                moved_elems_replicated=s["moved_replicated"],
                saved_elems_sharded=s["saved_sharded"],
                saved_elems_replicated=s["saved_replicated"],
                output_elems=s["output"],
                splittable_modules=sum(
                    isinstance(m, (nn.Linear, nn.Embedding)) for m in module.modules()
                ),
                param_tensors=len(own),
                attention_matmuls=tuple(recorder.attention.get(name, ())),
                attention_moved_elems=s["attention_moved"],
                attention_saved_elems=s["attention_saved"],
                attention_kv_elems=s["kv"],
            )
        )
    return ModelProfile(tuple(layers), hidden, tuple(tp_divisibility))
