"""Where an adaptive run stands, and how one step and one choice move it (pure).

Every rank holds the same :class:`AdaptState` and updates it from the same numbers (the
step's norms and time, all-reduced), so every rank takes the same decision without a
broadcast. Progress is counted in samples consumed (the data position) and in
scale-invariant steps of batch M0 (the schedule's clock, AdaScale §3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from unipar.adapt.chooser import BatchChoice, choose
from unipar.adapt.config import AdaptiveBatch, LRRule
from unipar.adapt.lr import efficiency, lr_factor, progress_step
from unipar.adapt.noise import NoiseEstimate, NoiseSample
from unipar.goodput.table import split_batch
from unipar.goodput.throughput import Observation

GROWTH = 2  # the most a batch grows at one choice
KEEP_OBSERVATIONS = 256  # the step times the throughput model is fitted on (the newest)
# Steps after a choice that changed the batch before the next choice: the new shape's
# step times (the first, a warm-up, and one more) and norms are in by then. While the
# batch moves it is re-chosen this often; once a choice keeps it, every ``adapt_every``.
SETTLE = 3


@dataclass(frozen=True)
class BatchShape:
    """A global batch as ``replicas × micro × accum``: each data replica runs ``accum``
    micro-batches of ``micro`` samples per optimizer step."""

    micro: int
    accum: int
    replicas: int

    @property
    def global_batch(self) -> int:
        return self.micro * self.accum * self.replicas

    @property
    def per_replica(self) -> int:
        return self.micro * self.accum


@dataclass(frozen=True)
class AdaptStats:
    """What a step reports of the adaptation (the same on every rank)."""

    global_batch: int
    noise_scale: float  # B_simple = tr(Σ)/|G|², samples
    efficiency: float  # statistical efficiency of this batch against M0 (Pollux eq. 6)
    goodput: float  # predicted steps of batch M0 per second at this batch (0: no model yet)
    lr_factor: float  # the learning rate's factor on the one written for M0
    progress: float  # scale-invariant steps of batch M0 done
    fit_error: float | None = None  # throughput model's RMS relative error (at choices)
    grad_sqr: float = 0.0  # smoothed unbiased |G|² (not floored; 0 before a first estimate)
    grad_var: float = 0.0  # smoothed unbiased tr(Σ) per sample (not floored)
    micro: int = 0  # the step's micro-batch per replica ...
    accum: int = 0  # ... and its micro-batches per replica (the shape whose time it took)
    held: bool = False  # the batch is one set from outside (a cluster scheduler's)


@dataclass(frozen=True)
class AdaptState:
    init_batch: int
    shape: BatchShape
    samples: int = 0
    progress: float = 0.0
    noise: NoiseEstimate = field(default_factory=NoiseEstimate)
    observations: tuple[Observation, ...] = ()
    goodput: float = 0.0
    fit_error: float | None = None
    since_choice: int = 0  # steps since the last choice (or the start)
    moving: bool = True  # the last choice changed the batch (or none was made yet)
    held: bool = False  # a batch set from outside (:meth:`hold`): no choice of its own

    @classmethod
    def start(cls, adaptive: AdaptiveBatch, init_batch: int, shape: BatchShape) -> AdaptState:
        noise = NoiseEstimate(adaptive.smoothing, per_samples=float(init_batch))
        return cls(init_batch, shape, noise=noise)

    def lr_factor(self, rule: LRRule) -> float:
        return lr_factor(
            rule, self.shape.global_batch, self.init_batch, self.noise.sqr, self.noise.var
        )

    def stats(self, rule: LRRule) -> AdaptStats:
        batch = self.shape.global_batch
        return AdaptStats(
            global_batch=batch,
            noise_scale=self.noise.noise_scale,
            efficiency=efficiency(batch, self.init_batch, self.noise.sqr, self.noise.var),
            goodput=self.goodput,
            lr_factor=self.lr_factor(rule),
            progress=self.progress,
            fit_error=self.fit_error,
            grad_sqr=self.noise.sqr_avg / self.noise.weight if self.noise.ready else 0.0,
            grad_var=self.noise.var_avg / self.noise.weight if self.noise.ready else 0.0,
            micro=self.shape.micro,
            accum=self.shape.accum,
            held=self.held,
        )

    def after_step(
        self, sample: NoiseSample | None, timed: tuple[BatchShape, float] | None = None
    ) -> AdaptState:
        """The state after a step at ``shape`` with these norms (and ``timed``: a step
        time seen, with the shape it ran at): the data position moves by the batch,
        progress by the gain (with the estimate before this step, as the step's learning
        rate had)."""
        batch = self.shape.global_batch
        gain = progress_step(batch, self.init_batch, self.noise.sqr, self.noise.var)
        noise = self.noise if sample is None else self.noise.update(sample)
        observations = self.observations
        if timed is not None and timed[1] > 0:
            # the whole step with its accumulation steps (Pollux's T_iter: s·T_grad + the
            # micro-batch that syncs; the fit reads T_grad off steps of two counts)
            shape, seconds = timed
            seen = Observation(1, shape.replicas, shape.micro, seconds, 0.0, shape.accum - 1)
            observations = (*observations, seen)[-KEEP_OBSERVATIONS:]
        return replace(
            self,
            samples=self.samples + batch,
            progress=self.progress + gain,
            noise=noise,
            observations=observations,
            since_choice=self.since_choice + 1,
        )

    def due(self, adaptive: AdaptiveBatch) -> bool:
        """Whether the next batch is to be chosen now: ``SETTLE`` steps after a choice
        that moved the batch (and at the start), ``adapt_every`` after one that kept it,
        once there are step times and |G|² has been estimated above 0."""
        wait = min(SETTLE, adaptive.adapt_every) if self.moving else adaptive.adapt_every
        signal = self.noise.ready and self.noise.sqr_avg > 0
        return not self.held and self.since_choice >= wait and bool(self.observations) and signal

    def choose(self, adaptive: AdaptiveBatch, max_micro: int) -> tuple[AdaptState, BatchChoice]:
        """The goodput-optimal shape on the same replicas (:func:`choose`), within
        ``GROWTH`` times the running batch either way (the estimates behind a choice are a
        few noisy steps old: the batch moves step by step, as they firm up); a choice of
        the batch already running keeps its micro-batching. While one micro-batch size
        has been timed, the state runs a probe (:meth:`_probe`) instead of the pick,
        which the returned choice still describes."""
        replicas = self.shape.replicas
        batch = self.shape.global_batch
        least = adaptive.min_global_batch or self.init_batch
        pick = choose(
            self.observations,
            self.noise,
            init_batch=self.init_batch,
            max_batch=min(adaptive.max_global_batch, GROWTH * batch),
            replicas=replicas,
            max_local=max_micro,
            min_batch=min(max(least, -(-batch // GROWTH)), batch),
        )
        shape = self.shape
        probe = self._probe(adaptive, max_micro, up=pick.global_batch >= shape.global_batch)
        if probe is not None:
            shape = probe
        elif pick.global_batch != shape.global_batch:
            shape = BatchShape(pick.local_batch, pick.accum_steps, replicas)
        moved = shape != self.shape
        chosen = replace(
            self, shape=shape, goodput=pick.goodput, fit_error=pick.fit_error,
            since_choice=0, moving=moved,
        )
        return chosen, pick

    def _probe(self, adaptive: AdaptiveBatch, max_micro: int, up: bool) -> BatchShape | None:
        """While the step times come from one micro-batch size, a shape ``GROWTH`` times
        bigger (``up``: the model's pick is not smaller) or smaller, within the bounds:
        one size cannot tell a step's fixed time from its time per sample, and the fit's
        even split of the two (:func:`unipar.goodput.throughput.fit`) would otherwise steer
        a model whose steps are mostly fixed cost (small models, many workers) by
        differences of a few samples, or never to a larger batch. Likewise a bigger batch
        that needs more accumulation steps, until a step with accumulation has been timed
        on these replicas: without one the fit cannot tell the synchronisation, which
        accumulation does not repeat, from the compute, which it does. None once two
        sizes and an accumulation are seen, or when no such shape is in bounds."""
        seen = {o.local_bsz for o in self.observations}
        batch, replicas = self.shape.global_batch, self.shape.replicas
        least = adaptive.min_global_batch or self.init_batch
        other = (
            min(GROWTH * batch, adaptive.max_global_batch)
            if up
            else max(-(-batch // GROWTH), least)
        )
        if other == batch:
            return None
        micro, accum = split_batch(other, replicas, max_micro)
        if len(seen) == 1 and micro not in seen:
            return BatchShape(micro, accum + 1, replicas)
        accumulated = any(o.accum > 0 and o.replicas == replicas for o in self.observations)
        if up and accum + 1 > self.shape.accum and not accumulated:
            return BatchShape(micro, accum + 1, replicas)
        return None

    def hold(self, batch: int, adaptive: AdaptiveBatch, max_micro: int) -> AdaptState:
        """The global ``batch`` set from outside (a cluster scheduler that chose it with the
        job's workers, Pollux §3: the policy sets both), within the job's bounds, split
        over the same replicas as :meth:`on_replicas` does; the state's own choices stop
        (:meth:`due`). The learning rate and progress follow it by the job's rule, as they
        follow a batch of its own choice."""
        least = adaptive.min_global_batch or self.init_batch
        batch = min(max(batch, least), adaptive.max_global_batch)
        micro, accum = split_batch(batch, self.shape.replicas, max_micro)
        shape = BatchShape(micro, accum + 1, self.shape.replicas)
        return replace(self, shape=shape, held=True, since_choice=0, moving=shape != self.shape)

    def on_replicas(self, replicas: int, max_micro: int) -> AdaptState:
        """The same global batch (rounded up to a multiple of ``replicas``) on a new
        number of data replicas (an elastic resize)."""
        if replicas == self.shape.replicas:
            return self
        micro, accum = split_batch(self.shape.global_batch, replicas, max_micro)
        return replace(self, shape=BatchShape(micro, accum + 1, replicas))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdaptState:
        return cls(
            init_batch=int(data["init_batch"]),
            shape=BatchShape(**data["shape"]),
            samples=int(data["samples"]),
            progress=float(data["progress"]),
            noise=NoiseEstimate(**data["noise"]),
            observations=tuple(Observation(**o) for o in data["observations"]),
            goodput=float(data["goodput"]),
            fit_error=data["fit_error"],
            since_choice=int(data.get("since_choice", 0)),
            moving=bool(data.get("moving", True)),
            held=bool(data.get("held", False)),
        )
