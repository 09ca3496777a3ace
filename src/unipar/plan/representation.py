"""The plan: one point in the unified space of parallel strategies, as plain data.

Data parallel, sharded data parallel and tensor parallel are shardings over axes of
one device mesh; pipeline parallel partitions the layer sequence into stages
(the view of Alpa, Zheng et al. 2022). The planner writes a :class:`Plan`; the
runtime only reads one. Plans round-trip through JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from unipar import checks
from unipar.errors import ConfigError


class PipelineSchedule(Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"


class Recompute(Enum):
    """Activation recompute: none, every layer's forward again in backward (full),
    only the attention core, whose activations grow with the sequence squared, and the
    element-wise ops (selective; Korthikanti et al. 2022, Sec. 5), or torchtitan's
    op-level policy (selective_op: each block saves the outputs of its attention
    kernel and of every other matrix product, and recomputes the other products and
    all element-wise and norm ops; torchtitan's ``_save_list``)."""

    NONE = "none"
    SELECTIVE = "selective"
    SELECTIVE_OP = "selective_op"
    FULL = "full"


class TensorParallelStyle(Enum):
    """How one layer splits over the ``tp`` axis."""

    REPLICATE = "replicate"  # whole on every tp rank
    MEGATRON = "megatron"  # heads and MLP split column- then row-wise (Shoeybi et al. 2019)
    VOCAB = "vocab"  # embedding or output projection split along the vocabulary


class GradSync(Enum):
    ALL_REDUCE = "all_reduce"
    PARAMETER_SERVER = "parameter_server"


class Strategy(Enum):
    """A named strategy: constraints on the planner, not a separate code path
    (``auto`` pins nothing)."""

    AUTO = "auto"
    DDP = "ddp"  # every worker a full replica, gradients all-reduced
    FSDP = "fsdp"  # every worker a shard of parameters, gradients and optimizer state
    TP = "tp"  # every layer split over all workers
    PP = "pp"  # the layers cut into one stage per worker

    @classmethod
    def parse(cls, value: str | Strategy) -> Strategy:
        if isinstance(value, Strategy):
            return value
        try:
            return cls(value.lower())
        except ValueError:
            choices = ", ".join(s.value for s in cls)
            raise ConfigError(
                f"strategy must be one of {choices} or a plan's JSON file, but got {value!r}"
            ) from None


class MeshAxis(Enum):
    """The named axes of a :class:`Mesh`."""

    PP = "pp"
    DP = "dp"
    FSDP = "fsdp"
    CP = "cp"
    TP = "tp"


@dataclass(frozen=True)
class Mesh:
    """Sizes of the named mesh axes; their product is the number of workers.

    ``cp`` (context parallel) splits each sample's sequence over its ranks: ring
    attention passes keys and values around them (Liu et al. 2023); they hold the same
    weights, so their gradients are reduced together with the data-parallel ones."""

    pp: int = 1
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for axis in fields(self):
            checks.integer(f"mesh axis {axis.name}", getattr(self, axis.name), minimum=1)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.fsdp * self.cp * self.tp

    def size(self, axis: MeshAxis) -> int:
        """The size of ``axis`` (the field its value names)."""
        return getattr(self, axis.value)

    @property
    def data_replicas(self) -> int:
        """Workers that see different samples: the dp and fsdp axes together."""
        return self.dp * self.fsdp

    def coordinates(self, rank: int) -> MeshCoordinates:
        """Where ``rank`` sits, with axes laid out (pp, dp, fsdp, cp, tp) and tp
        innermost, so tensor-parallel peers are neighbouring ranks (on one node), then
        context-parallel ones (Megatron-LM's order)."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank must be in [0, {self.world_size}), but got {rank}")
        rest, tp = divmod(rank, self.tp)
        rest, cp = divmod(rest, self.cp)
        rest, fsdp = divmod(rest, self.fsdp)
        pp, dp = divmod(rest, self.dp)
        return MeshCoordinates(pp=pp, dp=dp, fsdp=fsdp, tp=tp, cp=cp)


@dataclass(frozen=True)
class MeshCoordinates:
    """One rank's index along each mesh axis."""

    pp: int
    dp: int
    fsdp: int
    tp: int
    cp: int = 0


@dataclass(frozen=True)
class Plan:
    """How to run one optimizer step.

    ``microbatch_size`` samples go through each data replica per micro-step and
    ``num_microbatches`` micro-steps make an optimizer step (gradient accumulation
    without a pipeline, pipeline micro-batches with one), so the global batch is
    ``microbatch_size * num_microbatches * mesh.data_replicas``.
    ``stage_boundaries`` are the first layer index of pipeline stages 1..S-1.
    ``layer_tp`` gives each layer's tensor-parallel style, in layer order (empty: all
    replicated); ``sequence_parallel`` also splits norms and dropout along the sequence
    (Korthikanti et al. 2022). ``distributed_optimizer`` shards the optimizer state over
    the data-parallel ranks, which reduce-scatter gradients and all-gather the updated
    weights (ZeRO-1, Rajbhandari et al. 2020; Megatron-LM's distributed optimizer).
    ``recompute_every``: with full recompute, every n-th layer recomputes and the others
    keep their activations (1: all layers; Megatron-LM's ``--recompute-num-layers``,
    torchtitan's selective layer checkpointing).
    ``replica_samples``: uneven data-parallel shares, the samples of each step that data
    replica ``r`` (rank ``r``) takes, for replicas of different speed (a heterogeneous
    plan's :attr:`~unipar.plan.hetero.HeteroPlan.replica_samples`); plain data parallel
    only, each a multiple of ``microbatch_size``; ``num_microbatches`` is then the most
    any replica takes. Empty: every replica takes the same share.
    """

    mesh: Mesh = field(default_factory=Mesh)
    microbatch_size: int = 1
    num_microbatches: int = 1
    schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    virtual_stages: int = 1
    recompute: Recompute = Recompute.NONE
    reshard_after_forward: bool = True
    grad_sync: GradSync = GradSync.ALL_REDUCE
    stage_boundaries: tuple[int, ...] = ()
    layer_tp: tuple[TensorParallelStyle, ...] = ()
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    recompute_every: int = 1
    replica_samples: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("microbatch_size", "num_microbatches", "virtual_stages", "recompute_every"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:  # the common case at once: search makes many
                checks.integer(f"plan field {name}", value, minimum=1)
        if self.replica_samples:
            self._check_replica_samples()
        stages = self.mesh.pp * self.virtual_stages
        bounds = self.stage_boundaries
        if bounds and (
            len(bounds) != stages - 1
            or set(map(type, bounds)) != {int}  # bools and floats refused
            or list(bounds) != sorted(set(bounds))
            or bounds[0] < 1
        ):
            raise ConfigError(
                f"plan field stage_boundaries must list the first layer of stages 1..{stages - 1} "
                f"(pp={self.mesh.pp} x virtual_stages={self.virtual_stages} stages), increasing "
                f"and >= 1, but got {list(bounds)}; give {stages - 1} layer indices, or [] "
                "to let the runtime balance the stages"
            )

    def _check_replica_samples(self) -> None:
        shares, mesh, mb = self.replica_samples, self.mesh, self.microbatch_size
        if mesh.world_size != mesh.dp:
            raise ConfigError(
                f"plan field replica_samples (uneven data-parallel shares) needs plain data "
                f"parallelism, but the mesh has pp={mesh.pp}, fsdp={mesh.fsdp}, tp={mesh.tp}, "
                f"cp={mesh.cp}; use a mesh of dp only, or leave replica_samples out"
            )
        whole = all(isinstance(n, int) and not isinstance(n, bool) for n in shares)
        if (
            not whole
            or len(shares) != mesh.dp
            or any(n < mb or n % mb for n in shares)
            or max(shares) // mb != self.num_microbatches
        ):
            raise ConfigError(
                f"plan field replica_samples must give each of the dp={mesh.dp} replicas a "
                f"positive multiple of microbatch_size={mb} samples, the largest being "
                f"num_microbatches={self.num_microbatches} micro-batches, but got "
                f"{list(shares)}; take them from HeteroPlan.to_plan(), or drop replicas "
                "that take no samples"
            )

    @property
    def recomputed_fraction(self) -> float:
        """The share of layers whose forward runs again in backward (full recompute)."""
        return 1 / self.recompute_every if self.recompute is Recompute.FULL else 0.0

    @property
    def global_batch_size(self) -> int:
        if self.replica_samples:
            return sum(self.replica_samples)
        return self.microbatch_size * self.num_microbatches * self.mesh.data_replicas

    @classmethod
    def data_parallel(
        cls, workers: int, global_batch_size: int, microbatch_size: int | None = None
    ) -> Plan:
        """Plain data parallel over ``workers`` replicas, with gradient accumulation when
        ``microbatch_size`` is less than each worker's share of the batch."""
        if global_batch_size % workers:
            raise ConfigError(
                f"global_batch_size must be divisible by the number of workers, but got "
                f"global_batch_size={global_batch_size}, workers={workers}; use a batch of "
                f"{(global_batch_size // workers + 1) * workers}, or a number of workers "
                "that divides it"
            )
        per_worker = global_batch_size // workers
        microbatch_size = microbatch_size or per_worker
        if per_worker % microbatch_size:
            raise ConfigError(
                f"each worker's share of the batch must be a multiple of microbatch_size, but "
                f"got share={per_worker} (global_batch_size={global_batch_size} / "
                f"workers={workers}), microbatch_size={microbatch_size}; choose a divisor "
                f"of {per_worker}"
            )
        return cls(
            mesh=Mesh(dp=workers),
            microbatch_size=microbatch_size,
            num_microbatches=per_worker // microbatch_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """A plan from :meth:`to_dict`'s form, or from a plan report (the JSON of
        ``unipar plan --json``, whose ``full_plan`` it takes). ``mesh``,
        ``microbatch_size`` and ``num_microbatches`` are required; other fields default."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"a plan must be a JSON object of plan fields, but got {type(data).__name__}; "
                "pass the output of `unipar plan ... --json` or of Plan.to_json()"
            )
        if isinstance(data.get("full_plan"), dict):
            data = data["full_plan"]
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown plan fields {sorted(unknown)}; known: {sorted(known)}")
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise ConfigError(
                f"plan fields {missing} are missing; a plan names at least {list(_REQUIRED)} "
                '(e.g. {"mesh": {"dp": 2}, "microbatch_size": 4, "num_microbatches": 1})'
            )
        values = dict(data)
        values["mesh"] = _mesh(values["mesh"])
        for name in ("reshard_after_forward", "sequence_parallel"):
            if name in values:
                checks.boolean(f"plan field {name}", values[name])
        for name, enum in (
            ("schedule", PipelineSchedule),
            ("recompute", Recompute),
            ("grad_sync", GradSync),
        ):
            if name in values:
                values[name] = _enum_value(enum, values[name], name)
        for name in ("stage_boundaries", "layer_tp", "replica_samples"):
            if name in values and not isinstance(values[name], list):
                raise ConfigError(f"plan field {name} must be a list, but got {values[name]!r}")
        for name in ("stage_boundaries", "replica_samples"):
            if name in values:
                values[name] = tuple(values[name])
        if "layer_tp" in values:
            values["layer_tp"] = tuple(
                _enum_value(TensorParallelStyle, v, "layer_tp") for v in values["layer_tp"]
            )
        return cls(**values)

    @classmethod
    def from_json(cls, text: str, source: str = "the plan") -> Plan:
        """A plan from JSON text; ``source`` names it in errors (e.g. the file)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{source} is not valid JSON: {error.msg} at line {error.lineno}, column "
                f"{error.colno}; fix it there, or write it again with `unipar plan ... --json`"
            ) from None
        return cls.from_dict(data)


_REQUIRED = ("mesh", "microbatch_size", "num_microbatches")


def _mesh(value: Any) -> Mesh:
    axes = [axis.name for axis in fields(Mesh)]
    if not isinstance(value, dict) or set(value) - set(axes):
        raise ConfigError(
            f"plan field mesh must be an object with axes among {axes}, but got {value!r}"
        )
    return Mesh(**value)


def _enum_value(enum: type[Enum], value: Any, name: str) -> Enum:
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in enum)
        raise ConfigError(
            f"plan field {name} must be one of {choices}, but got {value!r}"
        ) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value
