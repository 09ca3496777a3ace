"""The README's and docs/'s code blocks run, so the documentation cannot drift from the code.

What each fence means here:

- ```python: executed in page order, one namespace per page, in this process (``fit``
  joins the session's Ray instance), in a fresh folder. The namespace's ``__name__`` is
  ``__main__``, so the functions a block defines reach Ray workers by value, as in a script.
- ```python / ```yaml / ```text with ``title="FILE"``: written to FILE in the page's
  folder, for the commands after them.
- ```bash: every command is checked first: ``unipar ...`` by unipar's own parser,
  ``make TARGET`` against the Makefile's targets (``make`` itself is never run here:
  ``make test`` would run this suite again, and ``make demo`` is the API example and
  ``unipar train`` at 200 steps). Then the ``unipar`` commands run in the page's folder:
  ``plan``, ``report`` and ``simulate`` in this process, the others (``train``) in a
  subprocess, since each starts a Ray instance of its own. A block after a
  ``<!-- docs-test: parse-only REASON -->`` comment is only parsed, for the reason given
  (a cluster of its own, or minutes).
- ```yaml without a title: parsed. ```text: output shown to the reader, not run.

The whole file costs about 200 CPU-seconds (every process, Ray's included, counted in a
cgroup), so at least 100 s on 2 cores; it took 4.6 minutes on 2 cores shared at a load
average of 12. The first test is the cheap one (seconds, nothing run).

The page's folder mirrors the repository's place: ``examples`` and ``tests`` link to the
repository's, and ``../shared`` to the ``shared`` folder beside it, so the commands run as
written from the repository's root.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)(.*)$")
TITLE = re.compile(r'title="([^"]+)"')
PARSE_ONLY = re.compile(r"<!--\s*docs-test:\s*parse-only\s+(.*?)\s*-->", re.S)
LANGUAGES = {"python", "bash", "yaml", "text"}
IN_PROCESS = {"plan", "report", "simulate"}  # pure, or they start no Ray of their own
LINKED = ("examples", "tests")  # repository folders the commands name


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    title: str | None
    code: str
    parse_only: str | None  # the reason, for a block after a parse-only comment

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    found, index, reason = [], 0, None
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            if lines[index].startswith("<!--"):  # a comment, to its end
                end = next(i for i in range(index, len(lines)) if "-->" in lines[i])
                marker = PARSE_ONLY.search("\n".join(lines[index : end + 1]))
                reason = " ".join(marker.group(1).split()) if marker else reason
                index = end
            elif lines[index].strip():
                reason = None  # text between the comment and the block: it is not the block's
            index += 1
            continue
        language, info = opening.group(1), opening.group(2)
        end = next(
            (i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), None
        )
        assert end is not None, f"{page.relative_to(ROOT)}:{index + 1}: a fence never closes"
        title = TITLE.search(info)
        found.append(
            Block(
                page=page,
                line=index + 1,
                language=language,
                title=title.group(1) if title else None,
                code="\n".join(lines[index + 1 : end]) + "\n",
                parse_only=reason,
            )
        )
        index, reason = end + 1, None
    return found


def commands_of(block: Block) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments out."""
    lines = block.code.replace("\\\n", " ").split("\n")
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def _redirected(argv: list[str]) -> tuple[list[str], str | None]:
    """``unipar plan ... > plan.json`` -> (the arguments, "plan.json")."""
    if ">" in argv:
        at = argv.index(">")
        assert at == len(argv) - 2, f"one '> FILE' at the end only, got {argv}"
        return argv[:at], argv[at + 1]
    return argv, None


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _strict_parser():  # type: ignore[no-untyped-def]
    """unipar's parser, taking only whole flag names: argparse's default also takes a
    prefix (``--max-batch`` for a flag renamed ``--max-batch-size``), which would hide a
    renamed flag from this check."""
    import argparse

    from unipar.cli.main import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.allow_abbrev = False
    return parser


def check_command(argv: list[str], block: Block) -> None:
    """Each command of a bash block is one the project knows, with arguments it takes."""
    program, args = argv[0], _redirected(argv)[0][1:]
    if program == "unipar":
        try:
            _strict_parser().parse_args(args)
        except SystemExit as stop:
            pytest.fail(f"{block.where}: `{shlex.join(argv)}` does not parse (exit {stop.code})")
    elif program == "make":
        missing = set(args) - _makefile_targets()
        assert not missing, f"{block.where}: the Makefile has no target {sorted(missing)}"
    elif program == "ray":
        assert block.parse_only, f"{block.where}: a `ray` command needs a parse-only comment"
    else:
        pytest.fail(f"{block.where}: the docs test does not know the command {program!r}")


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def test_every_block_is_known_and_its_commands_parse():
    """Cheap (no Ray, nothing run): fences, Python syntax, YAML, and every command."""
    assert len(ALL_BLOCKS) >= 20, "the pages lost their code blocks"
    for block in ALL_BLOCKS:
        assert block.language in LANGUAGES, (
            f"{block.where}: a fence without a known language ({block.language or 'none'}); "
            f"use one of {sorted(LANGUAGES)} (```text for output)"
        )
        if block.parse_only is not None:
            assert block.language == "bash" and len(block.parse_only) > 10, (
                f"{block.where}: a parse-only comment stands before a bash block and says why"
            )
        if block.language == "python":
            compile(block.code, block.where, "exec")
        elif block.language == "yaml":
            yaml.safe_load(block.code)
        elif block.language == "bash":
            assert commands_of(block), f"{block.where}: an empty bash block"
            for argv in commands_of(block):
                check_command(argv, block)


def _runs(block: Block) -> bool:
    if block.language == "python":
        return block.title is None
    commands = commands_of(block) if block.language == "bash" else []
    return block.parse_only is None and any(argv[0] == "unipar" for argv in commands)


@pytest.fixture
def page_folder(tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    folder.mkdir()
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")
    monkeypatch.chdir(folder)
    return folder


def _run_unipar(argv: list[str], block: Block, folder: Path) -> None:
    args, target = _redirected(argv)
    if args[1] in IN_PROCESS:
        from unipar.cli.main import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(args[1:])
        printed = out.getvalue()
    else:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run(
            [sys.executable, "-m", "unipar", *args[1:]],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        status, printed = done.returncode, done.stdout
        assert status == 0, f"{block.where}: `{shlex.join(argv)}` failed:\n{done.stderr[-3000:]}"
    assert status == 0, f"{block.where}: `{shlex.join(argv)}` exited {status}"
    if target:
        (folder / target).write_text(printed)


RUN_PAGES = [page for page in PAGES if any(_runs(block) for block in blocks_of(page))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_page_runs(page, page_folder, ray_cluster):
    namespace: dict = {"__name__": "__main__"}
    for block in blocks_of(page):
        if block.title is not None:
            (page_folder / block.title).write_text(block.code)
        elif block.language == "python":
            exec(compile(block.code, block.where, "exec"), namespace)
        elif block.language == "bash" and block.parse_only is None:
            for argv in commands_of(block):
                if argv[0] == "unipar":
                    _run_unipar(argv, block, page_folder)
