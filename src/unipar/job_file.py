"""The job ``unipar train`` runs: a built-in recipe by name, or a user's Python file.

A file that does not compile is refused before anything starts; one that fails while it
runs is reported in one line plus the user's own frames, never unipar's.
"""

from __future__ import annotations

import runpy
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from unipar.errors import ConfigError, UserCodeError
from unipar.recipes import RECIPES, recipe

if TYPE_CHECKING:
    from unipar.job import Job


def check_target(target: str) -> None:
    """Fail fast, before Ray starts, on a target that names nothing or does not compile."""
    if target in RECIPES:
        return
    path = Path(target)
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(
            f"{target!r} is neither a built-in recipe ({', '.join(sorted(RECIPES))}) nor an "
            "existing .py file; pass a recipe name or the path of a file that defines `job`"
        )
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as error:
        line = (error.text or "").rstrip("\n")
        raise UserCodeError(
            f"{path}, line {error.lineno}, column {error.offset}: {type(error).__name__}: "
            f"{error.msg}; fix the file and run again" + (f"\n    {line.strip()}" if line else "")
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot read the job file {path} ({error.strerror})") from None


def load_job(target: str) -> Job:
    """A built-in recipe by name, or a Python file defining ``job`` (a Job or a
    function returning one)."""
    # the command line checks a target before torch (which a Job imports) loads
    from unipar.job import Job  # noqa: PLC0415 (heavy: torch)

    check_target(target)
    if target in RECIPES:
        return recipe(target)
    path = Path(target)
    try:
        job = runpy.run_path(str(path), run_name="__unipar_job__").get("job")
        if callable(job) and not isinstance(job, Job):
            job = job()
    except Exception as error:
        raise user_code_error(error, f"the job file {path}") from None
    if not isinstance(job, Job):
        raise ConfigError(
            f"{path} must define `job`, a unipar.Job or a function returning one, "
            f"but it defines {'no `job`' if job is None else type(job).__name__}"
        )
    return job


def user_code_error(error: BaseException, where: str) -> UserCodeError:
    """``error`` raised by user code, as one line plus the frames outside unipar and
    the Python runtime (the user's own)."""
    ours = str(Path(__file__).parent)  # the unipar package
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith((ours, "<frozen")) and "/runpy.py" not in frame.filename
    ]
    own = "".join(traceback.format_list(frames)).rstrip()
    message = f"{where} failed: {type(error).__name__}: {error}"
    return UserCodeError(message + (f"\n{own}" if own else ""))
