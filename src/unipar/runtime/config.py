"""Settings of one run: where, on how many workers, under which plan, how it
checkpoints and recovers.

:class:`RunConfig` is the one description of these settings: ``fit`` takes one (or its
fields as keywords), ``unipar train`` derives its flags from the fields' metadata
(:func:`cli`), and the shared cluster's ``submit`` takes the fields marked
``submit=True``; so a setting is one field, declared, documented and checked once.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unipar import checks
from unipar.errors import ConfigError
from unipar.plan.representation import Plan, Strategy
from unipar.ray_cluster.address import check_address


def cli(help: str, *, submit: bool = False, **argparse: Any) -> dict[str, Any]:
    """Field metadata that makes the field a ``unipar train`` flag: ``help`` is its help
    text, ``argparse`` extra keywords of ``add_argument`` (``flag`` overrides its name,
    ``cli_default`` the default the command line gives it). ``submit``: a job queued on
    the shared cluster may set it (the scheduler sets the others)."""
    return {"help": help, "submit": submit, **argparse}


def worker_range(workers: Any) -> tuple[int | None, int]:
    """``fit``'s ``workers``: a number (``(None, n)``: a fixed size) or a range
    ``(least, most)``; the numbers are checked with the run's other settings."""
    if isinstance(workers, tuple):
        if len(workers) != 2:
            raise ConfigError(
                f"workers must be a number or a range (least, most), but got {workers!r}; "
                "pass e.g. workers=(2, 8)"
            )
        return workers[0], workers[1]
    return None, workers


def parse_plan(text: str) -> Plan | Strategy:
    """``--strategy``: ``auto``/``ddp``/``fsdp``/``tp``/``pp``, or the path of a plan's
    JSON file (as written by ``Plan.to_json()`` or ``unipar plan ... --json``)."""
    if not text.endswith(".json"):
        return Strategy.parse(text)
    path = Path(text)
    try:
        written = path.read_text()
    except OSError as error:
        raise ConfigError(
            f"cannot read the plan file {path} ({error.strerror or error}); pass a plan "
            "written by `unipar plan ... --json`, or a strategy name"
        ) from error
    return Plan.from_json(written, source=f"the plan file {path}")


def parse_workers(text: str) -> int | tuple[int, int]:
    """``--workers``: ``4``, or ``2:8`` (the fewest and the most workers)."""
    try:
        if ":" in text:
            least, most = text.split(":")
            return int(least), int(most)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers takes a number or a range MIN:MAX (like 2:8), not {text!r}"
        ) from None


@dataclass(frozen=True)
class RunConfig:
    """How to run a job. ``resume`` is ``False``, ``True`` (the newest checkpoint in
    ``checkpoint_dir``) or the path of a checkpoint or checkpoint directory.

    ``workers``: a number, or a range ``(least, most)`` (``--workers MIN:MAX``), kept as
    ``min_workers`` and ``workers``. ``plan``: a :class:`Plan`; a :class:`Strategy` (or
    its name) for the planner to complete on the connected cluster; ``None``: data
    parallel over ``workers`` (the command line's default is ``auto``). ``run_dir``:
    ``None`` gives ``unipar_runs/JOB-DATE-TIME-ID``."""

    # The most workers (the number to start with when the cluster has room).
    workers: int = field(
        default=2,
        metadata=cli(
            "number of worker processes, or a range MIN:MAX to train elastically on as many "
            "as the cluster gives",
            type=parse_workers,
        ),
    )
    min_workers: int | None = None  # the fewest to train on (None: ``workers``, a fixed size)
    plan: Plan | Strategy | None = field(
        default=None,
        metadata=cli(
            "auto (the planner chooses and explains), ddp, fsdp, tp, pp (the planner "
            "completes that strategy), or PLAN.json (the output of `unipar plan ... --json` "
            "or of Plan.to_json()) (default: auto)",
            flag="--strategy",
            cli_default="auto",
        ),
    )
    address: str | None = field(
        default=None,
        metadata=cli(
            "HOST:PORT of a running Ray cluster's head, or auto (default: start a local one)"
        ),
    )
    elastic: bool = field(
        default=True,
        metadata=cli(
            "on a lost worker, restart the whole gang from the newest checkpoint instead of "
            "recovering live",
            flag="--no-elastic",
            action="store_false",
        ),
    )
    snapshot_every: int | None = field(
        default=None,
        metadata=cli(
            "steps between in-memory snapshots of sharded state (default: as often as 2%% of "
            "the training time allows; replicated state needs none)",
            type=int,
            submit=True,
        ),
    )
    trace_steps: int | None = field(
        default=None,
        metadata=cli(
            "record the last N steps' forward, backward, gradient sync and optimizer on "
            "each pipeline rank: RUN_DIR/trace.json, RUN_DIR/timeline.png (measured under "
            "predicted) and measured vs predicted in the summary (default: off)",
            type=int,
            flag="--trace",
            metavar="N",
        ),
    )
    cpus_per_worker: float = field(
        default=1.0, metadata=cli("CPUs Ray reserves per worker", type=float)
    )
    gpus_per_worker: float = field(
        default=0.0, metadata=cli("GPUs Ray reserves per worker", type=float)
    )
    run_dir: Path | None = field(
        default=None,
        metadata=cli(
            "metrics and checkpoints go here (default: unipar_runs/JOB-DATE-TIME-ID)", type=Path
        ),
    )
    checkpoint_dir: Path | None = field(
        default=None, metadata=cli("default: RUN_DIR/checkpoints", type=Path)
    )
    checkpoint_every: int | None = field(
        default=None,
        metadata=cli(
            "steps between checkpoints (default: a tenth of the steps)", type=int, submit=True
        ),
    )
    keep_checkpoints: int = field(
        default=3,
        metadata=cli("how many of the newest checkpoints to keep", type=int, submit=True),
    )
    resume: bool | Path = field(
        default=False,
        metadata=cli(
            "resume from the newest checkpoint, or from PATH", nargs="?", const=True, type=Path
        ),
    )
    max_failures: int = field(
        default=3,
        metadata=cli("worker failures to recover from before giving up", type=int, submit=True),
    )
    progress: bool = field(
        default=True,
        metadata=cli("no live progress bar", flag="--no-progress", action="store_false"),
    )
    placement_timeout_s: float = field(
        default=60.0,
        metadata=cli(
            "seconds to wait for resources other jobs hold before giving up",
            type=float,
            flag="--placement-timeout",
        ),
    )
    collective_timeout_s: float = field(
        default=300.0,
        metadata=cli(
            "seconds a collective may wait for a peer before the gang is treated as broken",
            type=float,
            flag="--collective-timeout",
        ),
    )
    # The controller takes in step reports at most this often (it shares the workers'
    # cores); a lost worker is still seen within this interval.
    poll_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.workers, tuple):  # a range (least, most)
            least, most = worker_range(self.workers)
            if self.min_workers is not None:
                raise ConfigError(
                    f"give the range once: workers={self.workers!r} is a range, but "
                    f"min_workers={self.min_workers!r} too; pass workers=(least, most) alone"
                )
            object.__setattr__(self, "workers", most)
            object.__setattr__(self, "min_workers", least)
        if isinstance(self.plan, str):
            object.__setattr__(self, "plan", parse_plan(self.plan))
        if not (self.plan is None or isinstance(self.plan, (Plan, Strategy))):
            raise ConfigError(
                f"plan must be a Plan, a Strategy, a strategy name or None, but got "
                f"{type(self.plan).__name__}; pass e.g. plan='auto'"
            )
        check_address(self.address)
        run_dir = None if self.run_dir is None else checks.path("run_dir", self.run_dir)
        object.__setattr__(self, "run_dir", run_dir)
        self._check()
        for name in ("checkpoint_dir", "resume"):  # str -> Path, once checked
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))

    def _check(self) -> None:
        """The rules of every field."""
        most = checks.integer("workers", self.workers, minimum=1)
        if self.min_workers is not None:
            least = checks.integer("min_workers", self.min_workers, minimum=1)
            if least > most:
                raise ConfigError(
                    f"the fewest workers must not exceed the most, but got min={least} and "
                    f"max={most}; pass workers=({min(least, most)}, {max(least, most)}) "
                    f"(--workers {min(least, most)}:{max(least, most)})"
                )
        elastic = checks.boolean("elastic", self.elastic)
        if not elastic and self.least_workers != most:
            raise ConfigError(
                f"a worker range ({self.least_workers}..{most}) needs elastic training, but got "
                f"elastic=False; pass a fixed number of workers, or leave elastic on"
            )
        if self.snapshot_every is not None:
            checks.integer("snapshot_every", self.snapshot_every, minimum=0)
        if self.trace_steps is not None:
            checks.integer("trace_steps", self.trace_steps, minimum=1)
        cpus = checks.number("cpus_per_worker", self.cpus_per_worker, minimum=0)
        gpus = checks.number("gpus_per_worker", self.gpus_per_worker, minimum=0)
        if cpus == 0 and gpus == 0:
            raise ConfigError(
                "a worker needs a CPU or a GPU, but got cpus_per_worker=0, gpus_per_worker=0; "
                "pass cpus_per_worker=1 (--cpus-per-worker 1)"
            )
        if gpus > 1 and not gpus.is_integer():
            raise ConfigError(
                f"gpus_per_worker above 1 must be a whole number (Ray's rule), but got {gpus:g}; "
                f"pass {math.floor(gpus)} or {math.ceil(gpus)}"
            )
        if self.run_dir is not None:  # None: a fresh directory under unipar_runs/
            checks.directory_to_create("run_dir", Path(self.run_dir))
        if checks.path("checkpoint_dir", self.checkpoint_dir, optional=True) is not None:
            checks.directory_to_create("checkpoint_dir", Path(self.checkpoint_dir))
        if self.checkpoint_every is not None:
            checks.integer("checkpoint_every", self.checkpoint_every, minimum=1)
        checks.integer("keep_checkpoints", self.keep_checkpoints, minimum=1)
        if not isinstance(self.resume, bool):
            checks.path("resume", self.resume)
        checks.integer("max_failures", self.max_failures, minimum=0)
        checks.boolean("progress", self.progress)
        for name in ("placement_timeout_s", "collective_timeout_s", "poll_interval_s"):
            checks.number(name, getattr(self, name), above=0)

    @property
    def least_workers(self) -> int:
        return self.workers if self.min_workers is None else self.min_workers

    @property
    def checkpoints(self) -> Path:
        """``checkpoint_dir``, else ``RUN_DIR/checkpoints`` (the run directory set)."""
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        if self.run_dir is None:
            raise ValueError("the run directory is chosen with the job: see for_job()")
        return Path(self.run_dir) / "checkpoints"

    def for_job(self, job_name: str) -> RunConfig:
        """This config with its run directory chosen (``None``: a fresh
        :func:`default_run_dir` for ``job_name``), as given (relative or not)."""
        run_dir = default_run_dir(job_name) if self.run_dir is None else Path(self.run_dir)
        return dataclasses.replace(self, run_dir=run_dir)

    def replace(self, **changes: Any) -> RunConfig:
        """This config with ``changes`` (field names; ``workers`` may be a range);
        unknown names are refused with the list of settings."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(self))
            raise ConfigError(
                f"fit takes run settings (RunConfig's fields: {names}) and callbacks, "
                f"size_target, but got {', '.join(unknown)}; check the spelling"
            )
        if isinstance(changes.get("workers"), tuple):
            changes.setdefault("min_workers", None)
        elif "workers" in changes and "min_workers" not in changes:
            changes["min_workers"] = None
        return dataclasses.replace(self, **changes)

    def checkpoint_interval(self, steps: int) -> int:
        """Default: ten checkpoints over the run."""
        return self.checkpoint_every or max(1, steps // 10)


def cli_fields() -> list[dataclasses.Field[Any]]:
    """The fields that are ``unipar train`` flags, in declaration order."""
    return [f for f in dataclasses.fields(RunConfig) if "help" in f.metadata]


def submit_fields() -> list[str]:
    """The settings a job queued on the shared cluster may set."""
    return [f.name for f in cli_fields() if f.metadata["submit"]]


def default_run_dir(job_name: str, root: Path = Path("unipar_runs")) -> Path:
    """``ROOT/JOB-DATE-TIME-ID``: a random ID keeps runs started in the same second apart."""
    return root / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
