"""The ``unipar`` command on a user's own job file."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap

from unipar.cli.main import main
from unipar.plan import Plan

JOB_FILE = textwrap.dedent(
    """
    from unipar.testing import tiny_gpt_job

    def job():
        return tiny_gpt_job(steps=50)
    """
)


def _unipar(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "unipar", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def test_train_user_file_then_resume(tmp_path):
    (tmp_path / "my_job.py").write_text(JOB_FILE)
    first = _unipar(
        "train",
        "my_job.py",
        "--workers",
        "2",
        "--steps",
        "4",
        "--run-dir",
        "run",
        "--no-progress",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "loss" in first.stdout and "step_00000004" in first.stdout
    assert "chosen: " in first.stdout  # --strategy auto explains its plan first
    # The output of `unipar plan --json` is a plan `unipar train --strategy` takes. (The
    # command's own entry point, in this process: it starts no Ray, and a process of its
    # own would cost its imports, seconds of CPU, again.)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main([
            *("plan", "gpt", "--hidden", "32", "--layers", "2", "--heads", "2", "--vocab", "64"),
            *("--seq", "16", "--global-batch", "8", "--cluster", "a100-80g"),
            *("--gpus-per-node", "2", "--fix", "dp=2,microbatch=2,distributed_optimizer=false"),
            "--json",
        ])
    assert status == 0
    (tmp_path / "plan.json").write_text(printed.getvalue())
    assert Plan.from_json(printed.getvalue()) == Plan.data_parallel(2, 8, microbatch_size=2)
    again = _unipar(
        "train",
        "my_job.py",
        "--workers",
        "2",
        "--steps",
        "6",
        "--run-dir",
        "run",
        "--resume",
        "--strategy",
        "plan.json",
        "--no-progress",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "run/metrics.jsonl").open()]
    assert steps == [0, 1, 2, 3, 4, 5]


def test_unknown_target_is_a_clear_error(tmp_path):
    done = _unipar("train", "no-such-recipe", cwd=tmp_path)
    assert done.returncode == 2
    assert "neither a built-in recipe (gpt-stdlib) nor an existing .py file" in done.stderr


def test_unknown_strategy_is_a_clear_error(tmp_path):
    (tmp_path / "my_job.py").write_text(JOB_FILE)
    done = _unipar("train", "my_job.py", "--strategy", "zero4", cwd=tmp_path)
    assert done.returncode == 2
    assert "strategy must be one of auto, ddp, fsdp, tp, pp or a plan's JSON file" in done.stderr


def test_job_file_that_fails_to_import_is_one_line_and_the_users_frame(tmp_path):
    (tmp_path / "my_job.py").write_text("import math\nimport no_such_module\n\njob = None\n")
    done = _unipar("train", "my_job.py", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2
    first, *frames = done.stderr.strip().splitlines()
    assert first == (
        "unipar: error: the job file my_job.py failed: ModuleNotFoundError: "
        "No module named 'no_such_module'"
    )
    assert frames == ['  File "my_job.py", line 2, in <module>', "    import no_such_module"]
    assert not (tmp_path / "unipar_runs").exists()


def test_a_command_line_loads_only_its_own_commands_modules():
    """``unipar jobs`` needs neither PyTorch nor the planner; ``unipar --help`` and a
    mistyped command still list every command (about 1 s: two fresh interpreters)."""
    probe = textwrap.dedent(
        """
        import contextlib, io, sys
        from unipar.cli.entry import main
        sys.argv = ["unipar", *sys.argv[1:]]
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
            main()
        print("torch" in sys.modules, "plan" in out.getvalue())
        """
    )
    lines = [
        subprocess.run([sys.executable, "-c", probe, *words], capture_output=True, text=True,
                       timeout=120, check=True).stdout.split()
        for words in (["jobs", "--help"], ["--help"])
    ]
    assert lines[0] == ["False", "False"]  # no PyTorch, and only its own command's help
    assert lines[1][1] == "True"  # the whole list
