"""Measured traces per GPU type (Sia's layout), the ground truth of the typed simulator.

Data: the Sia artifact (Jayaram Subramanya et al., SOSP'23), ``sia-simulator/traces/APP/``:
``placements-TYPE.csv`` and ``scalability-TYPE.csv`` (seconds per step and per gradient
sync by spread and per-GPU batch, on GPUs of TYPE) and ``validation-<B>.csv`` (gradient
statistics per epoch at total batch B; they do not depend on the GPU type).

The ground truth follows Sia's simulator (``applications.py``, ``job.py``) so that its
published figures can be reproduced: a placement is looked up under its smallest rotation
and interpolated linearly in the per-GPU batch; an unmeasured spread is interpolated
linearly in (nodes, GPUs, per-GPU batch) over all measured points (scipy's
``LinearNDInterpolator``, nodes capped at 16). Where Sia's lookups fail (a batch outside a
placement's measured range, a point outside the measured hull) we clamp to the range and
take the nearest measured point. Gradient statistics are interpolated linearly between the
two measured total batches around a batch; epoch e ends at the least progress any
measured run had after e epochs. Policies never read these; they see what jobs report.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.traces import EPOCHS, StepTable, Validation, read_rows, read_validations
from unipar.sched.workload import JobSpec

# The paper's setting (Sia's ``applications.py`` and ``simulator_config.py``):
# checkpoint-restore seconds measured per application (others 30 s) ...
RESTART_SECONDS = {
    "cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0, "imagenet": 250.0,
    "ncf": 15.0,
}
# ... real runs' slowdown against the traces, fitted by Sia's authors (others 1.2) ...
SLOWDOWN = {"cifar10": 1.8, "ncf": 1.5}
# ... and the per-GPU batch that fits a GPU's memory where below the measured range.
MEMORY_LOCAL_BSZ = {("deepspeech2", "rtx"): 57}
MAX_INTERP_NODES = 16  # Sia caps the node count of an interpolated spread at 16


def placement_key(placement: Sequence[int]) -> str:
    """``(4, 2, 4)`` -> ``"244"``: GPUs per used node, smallest rotation (Sia's lookup key)."""
    used = tuple(g for g in placement if g > 0)
    rotation = min(used[i:] + used[:i] for i in range(len(used)))
    return "".join(map(str, rotation))


@dataclass(frozen=True, eq=False)  # hashed by identity: lookups are cached per object
class TypeTrace:
    """One application's measured step times on one GPU type."""

    gpu_type: str
    placements: dict[str, StepTable] = field(repr=False)
    points: np.ndarray = field(repr=False)  # (n, 3): nodes, GPUs, per-GPU batch
    values: np.ndarray = field(repr=False)  # (n, 2): step, sync seconds
    scalability: np.ndarray = field(repr=False)  # (m, 3) of scalability-TYPE.csv
    min_local: int
    max_local: int  # the largest measured per-GPU batch, or what fits memory
    replica_max_local: dict[int, int] = field(repr=False)  # by GPU count, in placements

    @functools.cached_property
    def _interpolators(self):
        # scipy is imported here only: the typed simulator's ground truth needs it
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator  # noqa: PLC0415 (heavy: scipy)
        from scipy.spatial import QhullError  # noqa: PLC0415 (heavy: scipy)

        nearest = NearestNDInterpolator(self.points, self.values)
        try:
            return LinearNDInterpolator(self.points, self.values), nearest
        except QhullError:  # degenerate points, e.g. all on one node
            return None, nearest

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (hashed by identity, few instances)
    def step_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """(step, sync) seconds on ``placement`` (GPUs per node) at per-GPU batch."""
        key = placement_key(placement)
        table = self.placements.get(key)
        if table is not None:
            return table.at(local_bsz)
        used = [g for g in placement if g > 0]
        query = np.array([[min(len(used), MAX_INTERP_NODES), sum(used), local_bsz]], float)
        linear, nearest = self._interpolators
        value = linear(query)[0] if linear is not None else np.full(2, np.nan)
        if not np.all(np.isfinite(value)):
            value = nearest(query)[0]
        return float(value[0]), float(value[1])

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def max_local_for(self, placement: tuple[int, ...]) -> int:
        """The largest per-GPU batch measured on this spread (Sia's ``get_max_local_bsz``),
        never above the type's limit."""
        table = self.placements.get(placement_key(placement))
        if table is not None:
            best = float(table.local_bsz.max())
        else:
            used = [g for g in placement if g > 0]
            s = self.scalability
            rows = s[(s[:, 0] >= len(used)) & (s[:, 1] >= sum(used))]
            best = float(rows[:, 2].max()) if len(rows) else float(self.max_local)
        return int(min(best, self.max_local))

    @functools.cached_property
    def one_gpu_throughput(self) -> float:
        """Samples per second on one GPU at the largest measured batch over the slowest
        step: what profiling a job on one GPU of this type gives (Sia's
        ``compute_throughputs``)."""
        table = self.placements["1"]
        return float(table.local_bsz.max() / table.step_time.max())


@dataclass(frozen=True, eq=False)
class TypedApplication:
    """One application's measured behaviour on every GPU type it was traced on."""

    name: str
    epochs: int
    restart_seconds: float
    slowdown: float  # real progress per second = measured goodput / slowdown
    init_batch: int  # M0, the smallest measured total batch
    max_batch: int
    validations: tuple[Validation, ...] = field(repr=False)
    traces: dict[str, TypeTrace] = field(repr=False)

    @property
    def max_local_bsz(self) -> int:
        """The largest per-GPU batch on any GPU type (what a workload row is checked by)."""
        return max(t.max_local for t in self.traces.values())

    def trace(self, gpu_type: str) -> TypeTrace:
        if gpu_type not in self.traces:
            raise ConfigError(
                f"application {self.name!r} has no trace for GPU type {gpu_type!r} (it has "
                f"{sorted(self.traces)})"
            )
        return self.traces[gpu_type]

    @functools.cached_property
    def _epoch_ends(self) -> np.ndarray:
        """Progress at the end of epoch e (index e; 0 for e = 0)."""
        ends = np.min([v.progress[: self.epochs] for v in self.validations], axis=0)
        return np.concatenate([[0.0], ends])

    def progress_at(self, epoch: int) -> float:
        return float(self._epoch_ends[min(epoch, self.epochs)])

    @property
    def target_progress(self) -> float:
        return self.progress_at(self.epochs)

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at total ``batch``, interpolated linearly
        between the measured batches around it (Sia's ``get_grad_stats``)."""
        vs = self.validations
        batches = [v.batch for v in vs]
        batch = min(max(batch, batches[0]), batches[-1])
        hi = next(i for i, b in enumerate(batches) if b >= batch)
        lo = max(i for i, b in enumerate(batches) if b <= batch)
        e = min(epoch, len(vs[lo].grad_sqr) - 1, len(vs[hi].grad_sqr) - 1)
        if lo == hi:
            return float(vs[lo].grad_sqr[e]), float(vs[lo].grad_var[e])
        w = (batch - batches[lo]) / (batches[hi] - batches[lo])
        sqr = (1 - w) * vs[lo].grad_sqr[e] + w * vs[hi].grad_sqr[e]
        var = (1 - w) * vs[lo].grad_var[e] + w * vs[hi].grad_var[e]
        return float(sqr), float(var)


def _type_trace(app: str, gpu_type: str, directory: Path) -> TypeTrace:
    rows = read_rows(directory / f"placements-{gpu_type}.csv")
    scal = read_rows(directory / f"scalability-{gpu_type}.csv")
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(placement_key(tuple(map(int, r["placement"]))), []).append(
            (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
        )
    placements = {}
    for key, vals in groups.items():
        arr = np.array(sorted(vals))
        placements[key] = StepTable(arr[:, 0], arr[:, 1], arr[:, 2])
    # Sia's interpolation points: placements averaged per (nodes, GPUs, batch), then the
    # scalability rows
    mean: dict[tuple, list] = {}
    for key, table in placements.items():
        spread = (len(key), sum(map(int, key)))
        for m, s, y in zip(table.local_bsz, table.step_time, table.sync_time, strict=True):
            mean.setdefault((*spread, m), []).append((s, y))
    scal_rows = np.array([[float(r[k]) for k in ("num_nodes", "num_replicas", "local_bsz",
                                                  "step_time", "sync_time")] for r in scal])
    point_rows = [(*k, *np.mean(v, axis=0)) for k, v in sorted(mean.items())]
    both = np.concatenate([np.array(point_rows), scal_rows]) if len(scal_rows) else np.array(
        point_rows)
    all_bsz = np.array([float(r["local_bsz"]) for r in rows])
    limit = MEMORY_LOCAL_BSZ.get((app, gpu_type), 1 << 30)
    by_replicas: dict[int, int] = {}
    for key, table in placements.items():
        r = sum(map(int, key))
        by_replicas[r] = max(by_replicas.get(r, 0), int(table.local_bsz.max()))
    return TypeTrace(
        gpu_type=gpu_type,
        placements=placements,
        points=both[:, :3],
        values=both[:, 3:],
        scalability=scal_rows[:, :3] if len(scal_rows) else np.zeros((0, 3)),
        min_local=int(all_bsz.min()),
        max_local=int(min(all_bsz.max(), limit)),
        replica_max_local=by_replicas,
    )


def load_typed_application(directory: Path) -> TypedApplication:
    name = directory.name
    validations = read_validations(directory)
    types = sorted(p.stem[len("placements-"):] for p in directory.glob("placements-*.csv"))
    traces = {t: _type_trace(name, t, directory) for t in types
              if (directory / f"scalability-{t}.csv").is_file()}
    return TypedApplication(
        name=name,
        epochs=EPOCHS[name],
        restart_seconds=RESTART_SECONDS.get(name, 30.0),
        slowdown=SLOWDOWN.get(name, 1.2),
        init_batch=validations[0].batch,
        max_batch=validations[-1].batch,
        validations=validations,
        traces=traces,
    )


def default_sia_reference_dir() -> Path:
    """``shared/reference/sia`` next to the repository (``<repo>/../shared/...``)."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "sia"


def load_typed_applications(reference_dir: Path) -> dict[str, TypedApplication]:
    """Every application under ``reference_dir/traces`` with a known epoch count (Sia's
    pipelined ``gpt_pmp`` is not one: its step times follow a pipeline schedule)."""
    traces = Path(reference_dir) / "traces"
    if not traces.is_dir():
        raise ConfigError(
            f"no traces folder at {traces}: pass the Sia reference data folder (the one "
            "holding traces/APP/placements-TYPE.csv), e.g. --reference ../shared/reference/sia"
        )
    apps = {d.name: load_typed_application(d) for d in sorted(traces.iterdir())
            if d.is_dir() and d.name in EPOCHS}
    if not apps:
        raise ConfigError(f"no application traces under {traces} (known: {sorted(EPOCHS)})")
    return apps


def check_traced(
    specs: Sequence[JobSpec], apps: dict[str, TypedApplication], types: Sequence[str],
    path: Path,
) -> None:
    """Every job's application has a trace for every GPU type of the cluster."""
    for spec in specs:
        missing = [t for t in types if t not in apps[spec.application].traces]
        if missing:
            raise ConfigError(
                f"{path}:{spec.line}: job {spec.name!r} is application {spec.application!r}, "
                f"which has no trace for GPU type {missing[0]!r} of the cluster (no "
                f"placements-{missing[0]}.csv); remove the row or the {missing[0]} nodes"
            )
