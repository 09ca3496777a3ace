"""Settings of one run: where, on how many workers, how it checkpoints and recovers.

:class:`RunConfig` is the one description of these settings: ``fit`` builds one from
its keywords and ``unipar train`` derives its flags from the fields' metadata
(:func:`cli`), so a setting is declared, documented and checked once.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unipar import validate


def cli(help: str, **argparse: Any) -> dict[str, Any]:
    """Field metadata that makes the field a ``unipar train`` flag: ``help`` is its help
    text, ``argparse`` extra keywords of ``add_argument`` (``flag`` overrides its name)."""
    return {"help": help, **argparse}


def parse_workers(text: str) -> int | tuple[int, int]:
    """``--workers``: ``4``, or ``2:8`` (the fewest and the most workers)."""
    import argparse

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
    ``checkpoint_dir``) or the path of a checkpoint or checkpoint directory."""

    # The most workers (the number to start with when the cluster has room); the CLI's
    # ``--workers MIN:MAX`` also sets ``min_workers``.
    workers: int = field(
        default=2,
        metadata=cli(
            "number of worker processes, or a range MIN:MAX to train elastically on as many "
            "as the cluster gives",
            type=parse_workers,
        ),
    )
    min_workers: int | None = None  # the fewest to train on (None: ``workers``, a fixed size)
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
    run_dir: Path = field(
        default=Path("unipar_runs"),
        metadata=cli(
            "metrics and checkpoints go here (default: unipar_runs/JOB-DATE-TIME-ID)", type=Path
        ),
    )
    checkpoint_dir: Path | None = field(
        default=None, metadata=cli("default: RUN_DIR/checkpoints", type=Path)
    )
    checkpoint_every: int | None = field(
        default=None,
        metadata=cli("steps between checkpoints (default: a tenth of the steps)", type=int),
    )
    keep_checkpoints: int = field(
        default=3, metadata=cli("how many of the newest checkpoints to keep", type=int)
    )
    resume: bool | Path = field(
        default=False,
        metadata=cli(
            "resume from the newest checkpoint, or from PATH", nargs="?", const=True, type=Path
        ),
    )
    max_failures: int = field(
        default=3, metadata=cli("worker failures to recover from before giving up", type=int)
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
    collective_timeout_s: float = 300.0
    # The controller takes in step reports at most this often (it shares the workers'
    # cores); a lost worker is still seen within this interval.
    poll_interval_s: float = 0.5

    def __post_init__(self) -> None:
        validate.check_run_config(self)
        for name in ("run_dir", "checkpoint_dir", "resume"):  # str -> Path, once checked
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))

    @property
    def least_workers(self) -> int:
        return self.workers if self.min_workers is None else self.min_workers

    @property
    def checkpoints(self) -> Path:
        return (
            Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.run_dir) / "checkpoints"
        )

    def checkpoint_interval(self, steps: int) -> int:
        """Default: ten checkpoints over the run."""
        return self.checkpoint_every or max(1, steps // 10)


def cli_fields() -> list[dataclasses.Field[Any]]:
    """The fields that are ``unipar train`` flags, in declaration order."""
    return [f for f in dataclasses.fields(RunConfig) if "help" in f.metadata]


def default_run_dir(job_name: str, root: Path = Path("unipar_runs")) -> Path:
    """``ROOT/JOB-DATE-TIME-ID``: a random ID keeps runs started in the same second apart."""
    return root / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
