"""Measured training traces of the Pollux evaluation applications.

Data: the public artifact of Pollux (Qiao et al., OSDI'21), folder ``simulator/traces``.
Per application: step times per placement and per-GPU batch (``placements.csv``,
``scalability.csv``) and one run per total batch size (``validation-<B>.csv``: progress,
gradient square norm and variance per epoch). The simulator uses these as the ground truth
of a job's speed; policies never read them (they see only what a job reports).
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unipar.errors import ConfigError

# The paper's setting (Pollux §5.1 and the data's README): epochs to completion and the
# per-GPU batch limits (yolov3's per-GPU batch is at most 8).
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}


def default_reference_dir() -> Path:
    """``shared/reference/pollux`` next to the repository (``<repo>/../shared/...``)."""
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "reference" / "pollux"


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class StepTable:
    """Step and sync seconds over per-GPU batch for one spread (interpolated linearly)."""

    local_bsz: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray

    def at(self, local_bsz: float) -> tuple[float, float]:
        return (
            float(np.interp(local_bsz, self.local_bsz, self.step_time)),
            float(np.interp(local_bsz, self.local_bsz, self.sync_time)),
        )


def step_tables(rows: list[dict[str, str]], key) -> dict:
    """Rows grouped by ``key(row)``, each group a :class:`StepTable` sorted by batch."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(key(row), []).append(
            (float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        )
    out = {}
    for k, vals in groups.items():
        arr = np.array(sorted(vals))
        out[k] = StepTable(arr[:, 0], arr[:, 1], arr[:, 2])
    return out


@dataclass(frozen=True)
class Validation:
    """One measured run at total batch ``batch``: gradient statistics per epoch."""

    batch: int
    progress: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


@dataclass(frozen=True, eq=False)  # hashed by identity: step times are cached per object
class Application:
    """One application's measured behaviour (ground truth for the simulator)."""

    name: str
    epochs: int
    progress_per_epoch: float
    init_batch: int  # M0: the smallest measured total batch; progress counts M0-steps
    max_batch: int
    max_local_bsz: int
    min_local_bsz: int
    placements: dict[str, StepTable] = field(repr=False)
    scalability: dict[tuple[int, int], StepTable] = field(repr=False)
    validations: tuple[Validation, ...] = field(repr=False)

    @property
    def target_progress(self) -> float:
        return self.epochs * self.progress_per_epoch

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (frozen, hashable, few instances)
    def step_time(self, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """Measured (step, sync) seconds for GPUs-per-node ``placement`` and per-GPU batch."""
        used = sorted(g for g in placement if g > 0)
        key = "".join(map(str, used))
        if key in self.placements:
            return self.placements[key].at(local_bsz)
        nodes, replicas = len(used), sum(used)
        groups = sorted({n for n, _ in self.scalability})
        group = next((n for n in groups if n >= nodes), groups[-1])
        counts = sorted(r for n, r in self.scalability if n == group)
        replicas = min(max(replicas, counts[0]), counts[-1])
        hi = next(r for r in counts if r >= replicas)
        lo = max(r for r in counts if r <= replicas)
        s_lo, y_lo = self.scalability[(group, lo)].at(local_bsz)
        if hi == lo:
            return s_lo, y_lo
        s_hi, y_hi = self.scalability[(group, hi)].at(local_bsz)
        w = (replicas - lo) / (hi - lo)
        return s_lo + w * (s_hi - s_lo), y_lo + w * (y_hi - y_lo)

    def validation_for(self, batch: float) -> Validation:
        """The measured run whose total batch is nearest ``batch`` (in log scale)."""
        logs = [abs(np.log(v.batch / batch)) for v in self.validations]
        return self.validations[int(np.argmin(logs))]

    def grad_stats(self, batch: float, progress: float) -> tuple[float, float]:
        """(grad_sqr, grad_var) of the current epoch (row ⌊progress / per-epoch⌋, the
        statistics measured over that epoch), from the run nearest ``batch``."""
        v = self.validation_for(batch)
        epoch = min(int(progress / self.progress_per_epoch), len(v.progress) - 1)
        return float(v.grad_sqr[epoch]), float(v.grad_var[epoch])

    def gain(self, batch: float, progress: float) -> float:
        """Progress (M0-steps) per step at total ``batch``: S·E = (var+sqr)/(var/S+sqr).

        Pollux §3.1, efficiency with gradient noise scale; S = batch / M0.
        """
        sqr, var = self.grad_stats(batch, progress)
        scale = batch / self.init_batch
        return (var + sqr) / (var / scale + sqr)


def read_validations(directory: Path) -> tuple[Validation, ...]:
    """Every ``validation-<B>.csv`` of an application, by total batch B."""
    validations = []
    for path in sorted(directory.glob("validation-*.csv")):
        rows = read_rows(path)
        arr = np.array([[float(r[k]) for k in ("progress", "grad_sqr", "grad_var")] for r in rows])
        batch = int(path.stem.split("-")[1])
        validations.append(Validation(batch, arr[:, 0], arr[:, 1], arr[:, 2]))
    if not validations:
        raise ConfigError(f"no validation-<BATCH>.csv files in {directory}")
    return tuple(sorted(validations, key=lambda v: v.batch))


def load_application(directory: Path) -> Application:
    name = directory.name
    if name not in EPOCHS:
        raise ConfigError(f"no epoch count known for application {name!r} in {directory}")
    placements = step_tables(read_rows(directory / "placements.csv"), lambda r: r["placement"])
    scalability = step_tables(
        read_rows(directory / "scalability.csv"),
        lambda r: (int(r["num_nodes"]), int(r["num_replicas"])),
    )
    validations = read_validations(directory)
    first = validations[0]
    per_epoch = float(first.progress[-1] / len(first.progress))
    all_bsz = np.concatenate([t.local_bsz for t in placements.values()])
    max_local = int(min(all_bsz.max(), MAX_LOCAL_BSZ.get(name, 1 << 30)))
    return Application(
        name=name,
        epochs=EPOCHS[name],
        progress_per_epoch=per_epoch,
        init_batch=first.batch,
        max_batch=validations[-1].batch,
        max_local_bsz=max_local,
        min_local_bsz=int(all_bsz.min()),
        placements=placements,
        scalability=scalability,
        validations=validations,
    )


def load_applications(reference_dir: Path) -> dict[str, Application]:
    """Every application under ``reference_dir/traces``."""
    traces = Path(reference_dir) / "traces"
    if not traces.is_dir():
        raise ConfigError(
            f"no traces folder at {traces}: pass the Pollux reference data folder (the "
            "one holding traces/ and workloads-*/), e.g. --reference ../shared/reference/pollux"
        )
    return {d.name: load_application(d) for d in sorted(traces.iterdir()) if d.is_dir()}
