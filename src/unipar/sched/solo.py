"""One job alone on k GPUs of the simulated cluster, trained to its trace's completion.

The ground truth is the simulator's (:mod:`unipar.sched.simulator`): a step's seconds are
the measured step time for its placement (the fewest nodes of ``gpus_per_node`` GPUs), its
per-GPU batch and its micro-batches (one synchronisation per step); its progress, in steps
of batch M0, is Pollux's gain (var + sqr)/(var/S + sqr), S = M/M0 (Qiao et al. 2021, §3.1),
with the gradient statistics measured at the current epoch of the run nearest the batch.
The gain is what a step of batch M is worth when the learning rate follows the batch by
the rule that makes it so (AdaScale, Johnson et al. 2020) and the schedule runs on that
progress: every batch here, fixed or adaptive, is held to the same rule.

- :func:`fixed_run`: one batch throughout, epoch by epoch (closed form).
- :func:`best_schedule_run`: in every epoch the batch that makes progress fastest, known
  exactly (closed form): what no batch policy beats on this ground truth.
- :func:`adaptive_run`: the runtime's own :class:`~unipar.adapt.state.AdaptState`, step
  by step, with the same calls the trainer makes (:mod:`unipar.runtime.adaptive`): each
  step reports a noise sample and its time (``after_step``), and a choice is made when
  ``due``. The noise sample is what the trainer measures on that shape: the squared norms
  of the data replicas' gradients and of their mean; on one replica, of the first
  micro-batch's gradient and the step's, or, with a single micro-batch, of two consecutive
  steps' gradients (as AdaptDL's estimator; :class:`~unipar.runtime.adaptive.AdaptiveStep`
  does the same). The gradients are drawn as Gaussian vectors in ``dims`` dimensions with
  the trace's |G|² and tr(Σ) (exact draws of their squared norms: non-central and central
  chi-square), and each step's time is the trace's times a seeded lognormal jitter: the
  estimates the state acts on are as noisy as measured ones, and a seed gives a spread.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from unipar.adapt.config import AdaptiveBatch
from unipar.adapt.noise import NoiseSample
from unipar.adapt.state import AdaptState, BatchShape
from unipar.goodput.table import split_batch
from unipar.sched.traces import Application

DIMS = 100  # the gradient's dimensions in the noise model: a norm's relative spread √(2/D)
JITTER = 0.05  # relative spread (lognormal σ) of one step's time around the trace's


@dataclass(frozen=True)
class SoloRun:
    """A run to completion: seconds, optimizer steps, and the seconds spent at each
    global batch; ``estimated_progress``: the run's own count of its progress (the
    schedule's clock), against the trace's ``target_progress``."""

    seconds: float
    steps: int
    target_progress: float
    estimated_progress: float
    at_batch: Mapping[int, float] = field(default_factory=dict)

    @property
    def final_batch(self) -> int:
        return max(self.at_batch, key=lambda b: self.at_batch[b]) if self.at_batch else 0


def placement(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """GPUs per node on the fewest nodes."""
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


class _Truth:
    """The trace's step seconds per shape and gain per (batch, epoch), cached."""

    def __init__(self, app: Application, gpus: int, gpus_per_node: int) -> None:
        self.app, self.where = app, placement(gpus, gpus_per_node)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one instance per run)
    def seconds(self, micro: int, accum: int) -> float:
        """A step of ``accum`` micro-batches of ``micro`` per GPU: the measured step, plus
        its compute (step − sync) for each further micro-batch."""
        step, sync = self.app.step_time(self.where, micro)
        return step + (step - sync) * (accum - 1)

    def epoch(self, progress: float) -> int:
        return int(progress / self.app.progress_per_epoch)

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def stats(self, batch: int, epoch: int) -> tuple[float, float]:
        return self.app.grad_stats(batch, epoch * self.app.progress_per_epoch)

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def gain(self, batch: int, epoch: int) -> float:
        return self.app.gain(batch, epoch * self.app.progress_per_epoch)


def measured_batches(app: Application, gpus: int) -> tuple[int, ...]:
    """The total batches the trace measured whose split over ``gpus`` is even and whose
    per-GPU batch was timed (at least the smallest measured, at most the largest)."""
    out = []
    for v in app.validations:
        local, accum = split_batch(v.batch, gpus, app.max_local_bsz)
        if gpus * local * (accum + 1) == v.batch and local >= app.min_local_bsz:
            out.append(v.batch)
    return tuple(out)


def fixed_run(app: Application, gpus: int, batch: int, gpus_per_node: int = 4) -> SoloRun:
    """``batch`` throughout (split as :func:`unipar.goodput.table.split_batch`)."""
    local, accum = split_batch(batch, gpus, app.max_local_bsz)
    truth = _Truth(app, gpus, gpus_per_node)
    step = truth.seconds(local, accum + 1)
    seconds = steps = 0.0
    for epoch in range(app.epochs):
        per_step = truth.gain(batch, epoch)
        steps += app.progress_per_epoch / per_step
        seconds += step * app.progress_per_epoch / per_step
    return SoloRun(seconds, math.ceil(steps), app.target_progress, app.target_progress,
                   {batch: seconds})


def best_schedule_run(app: Application, gpus: int, gpus_per_node: int = 4,
                      max_micro_batches: int = 64) -> SoloRun:
    """In every epoch the fastest-progressing shape there is, chosen knowing the epoch's
    gradient statistics and step times exactly, with no cost to change it.

    Within an epoch the gain and the step time of a shape are constant, so a run's seconds
    are Σ_epochs progress_per_epoch / rate, rate = gain(M) / seconds(micro, accum), and
    taking the largest rate in each epoch minimises the sum: on the closed form, no policy
    that sets the batch at any time, from any measurements, finishes sooner. The shapes:
    every per-GPU batch from 1 (the adaptive run may start below the smallest one timed,
    whose time the trace then gives) to ``max_local_bsz``, 1 to ``max_micro_batches``
    micro-batches (more gave the same on every Pollux application and size, checked with
    no cap), total M from M0 to the largest measured; every even split of a measured
    batch, so each of :func:`fixed_run`'s, is one of them. A step-by-step run
    (:func:`adaptive_run`) can come in below it by a little: a step that crosses an epoch's
    end makes all its progress at the earlier epoch's gain (at most about 3e-4 of the run
    on these traces), and its step times are jittered around the trace's."""
    truth = _Truth(app, gpus, gpus_per_node)
    shapes = [(m, a) for m in range(1, app.max_local_bsz + 1)
              for a in range(1, min(max_micro_batches, app.max_batch // (gpus * m)) + 1)
              if gpus * m * a >= app.init_batch]
    seconds = np.array([truth.seconds(m, a) for m, a in shapes])
    batches = [gpus * m * a for m, a in shapes]
    total, steps = 0.0, 0.0
    at_batch: dict[int, float] = {}
    for epoch in range(app.epochs):
        gain = np.array([truth.gain(b, epoch) for b in batches])
        best = int(np.argmax(gain / seconds))
        took = app.progress_per_epoch / gain[best] * seconds[best]
        total += took
        steps += app.progress_per_epoch / gain[best]
        at_batch[batches[best]] = at_batch.get(batches[best], 0.0) + took
    return SoloRun(total, math.ceil(steps), app.target_progress, app.target_progress,
                   at_batch)


def draw_sample(
    rng: np.random.Generator, sqr: float, var: float, small_batch: int, count: int,
    dims: int, first_only: bool,
) -> NoiseSample:
    """The norms of ``count`` gradients over ``small_batch`` samples each (|G|² ``sqr``,
    tr(Σ) per sample ``var``) and of their mean, as :class:`NoiseSample` holds them: the
    mean of their squared norms, or (``first_only``) the first one's. Each gradient is
    G + n_i, n_i ~ N(0, σ²·I) in ``dims`` dimensions, σ² = var / (small_batch·dims):
    |ḡ|² = (σ²/c)·χ'²(dims, c|G|²/σ²) and Σ|g_i|² = c|ḡ|² + σ²·χ²(dims·(c−1)), the
    spread independent of the mean; one of them is |g_1|² = (|ḡ| + u∥)² + |u⊥|², u the
    first's deviation from the mean, N(0, σ²(1 − 1/c)) per dimension."""
    sigma2 = max(var, 1e-30) / (small_batch * dims)
    lam = sqr * count / sigma2
    draw = rng.noncentral_chisquare(dims, lam) if lam > 0 else rng.chisquare(dims)
    big = sigma2 / count * float(draw)
    if not first_only:
        small = big + sigma2 * float(rng.chisquare(dims * (count - 1))) / count
    else:
        dev = sigma2 * (1.0 - 1.0 / count)
        along = math.sqrt(big) + float(rng.normal(0.0, math.sqrt(dev)))
        small = along * along + dev * float(rng.chisquare(dims - 1))
    return NoiseSample(small, big, small_batch, count)


def trainer_sample(
    rng: np.random.Generator, shape: BatchShape, sqr: float, var: float, dims: int
) -> NoiseSample:
    """The sample the trainer measures on ``shape`` (see the module's docstring)."""
    if shape.replicas > 1:
        return draw_sample(rng, sqr, var, shape.per_replica, shape.replicas, dims, False)
    if shape.accum > 1:
        return draw_sample(rng, sqr, var, shape.micro, shape.accum, dims, True)
    return draw_sample(rng, sqr, var, shape.micro, 2, dims, False)  # two consecutive steps


def default_adaptive(app: Application) -> AdaptiveBatch:
    """Pollux's range: M0 up to the largest measured batch, per-GPU batch up to the
    application's largest."""
    return AdaptiveBatch(max_global_batch=app.max_batch, max_local_batch=app.max_local_bsz)


def adaptive_run(
    app: Application,
    gpus: int,
    *,
    seed: int,
    gpus_per_node: int = 4,
    adaptive: AdaptiveBatch | None = None,
    dims: int = DIMS,
    jitter: float = JITTER,
) -> SoloRun:
    """The adaptive batch from M0 (split over ``gpus`` as the runtime splits it), to the
    trace's completion (see the module's docstring); bounds that are equal hold the batch
    there from the first step, as the runtime does."""
    adaptive = adaptive or default_adaptive(app)
    rng = np.random.default_rng(seed)
    truth = _Truth(app, gpus, gpus_per_node)
    max_micro = adaptive.max_local_batch or max(1, adaptive.max_global_batch // gpus)
    least = adaptive.min_global_batch or app.init_batch
    held = least == adaptive.max_global_batch  # equal bounds: held there from the start
    micro, accum = split_batch(least if held else app.init_batch, gpus, max_micro)
    state = AdaptState.start(adaptive, app.init_batch, BatchShape(micro, accum + 1, gpus))
    target = app.target_progress
    progress = seconds = 0.0
    steps = 0
    at_batch: dict[int, float] = {}
    while progress < target:
        shape = state.shape
        batch, epoch = shape.global_batch, truth.epoch(progress)
        took = truth.seconds(shape.micro, shape.accum) * float(rng.lognormal(0.0, jitter))
        sqr, var = truth.stats(batch, epoch)
        # the trace's grad_var is the variance of a batch-M0 gradient; the state's, per sample
        sample = trainer_sample(rng, shape, sqr, var * app.init_batch, dims)
        # a process's first step warms up: not a time to fit (as in the trainer)
        state = state.after_step(sample, (shape, took) if steps else None)
        progress += truth.gain(batch, epoch)
        seconds += took
        at_batch[batch] = at_batch.get(batch, 0.0) + took
        steps += 1
        if state.due(adaptive):
            state, _ = state.choose(adaptive, max_micro)
    return SoloRun(seconds, steps, target, state.progress, at_batch)


def requested_batch(application: str, workloads: list[list]) -> int | None:
    """The batch users of ``application`` ask for most often in ``workloads`` (lists of
    :class:`~unipar.sched.workload.JobSpec`): the application's default batch, the one
    the Pollux paper's fixed-batch baselines run (None: never asked for)."""
    counts: dict[int, int] = {}
    for specs in workloads:
        for s in specs:
            if s.application == application:
                counts[s.batch_size] = counts.get(s.batch_size, 0) + 1
    return max(counts, key=lambda b: (counts[b], -b)) if counts else None
