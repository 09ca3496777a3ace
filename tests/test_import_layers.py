"""unipar's modules import each other without a cycle, imports inside functions included,
and every import inside a function says why it waits (``# noqa: PLC0415 (reason)``).

The module graph is built here from the source with ``ast``, independently of
import-linter (whose contracts in pyproject.toml check the layers in ``make test``), so
the rule holds where a contract cannot express it: a package's ``__init__`` and its own
modules, a module and its parent. The graph tests read files (about 2 s each on a busy
2-core machine); the entry-point tests start a fresh interpreter each (up to 4 s).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "unipar"
REASON = re.compile(r"#\s*noqa:[^#]*\bPLC0415\b\s*\((?P<reason>[^)]+)\)")


def module_files(root: Path = SRC) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` lives in: itself, or the nearest enclosing module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement may bind: ``from a import b`` is ``a`` and, if
    ``b`` is a submodule, ``a.b``; relative imports resolved against ``module``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``importer -> imported modules`` of the package, from every import statement
    (at module level, inside functions and under ``TYPE_CHECKING`` alike)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, path.name == "__init__.py"):
                target = _owner(name, modules) if name.startswith(PACKAGE) else None
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, source line) of each import inside a function (not under TYPE_CHECKING)."""
    lines = path.read_text().splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append((child.lineno, lines[child.lineno - 1]))
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inside)

    visit(ast.parse("\n".join(lines), str(path)), False)
    return found


def test_no_import_cycle_among_the_modules():
    modules = module_files()
    assert len(modules) > 100, "the package's modules were not found"
    graph = import_graph(modules)
    assert sum(len(targets) for targets in graph.values()) > 300
    assert cycles(graph) == []


def test_every_import_inside_a_function_names_its_reason():
    unmarked = [
        f"{path.relative_to(SRC)}:{line}: {text.strip()}"
        for path in module_files().values()
        for line, text in imports_inside_functions(path)
        if not REASON.search(text)
    ]
    assert unmarked == [], "mark each with `# noqa: PLC0415 (heavy: ...)` or move it up"


# What each entry point must not load when imported: the reasons the imports inside
# functions give ("heavy: torch", "heavy: Ray", ...), held to account.
LIGHT_ENTRY_POINTS = {
    "unipar.cli.main": ("torch", "ray", "matplotlib", "transformers", "xgboost"),
    "unipar.service.client": ("torch",),
    "unipar.xgboost": ("torch", "ray", "xgboost", "sklearn"),
    "unipar.plan": ("torch", "ray"),
    "unipar.optimizer": ("torch",),
}


@pytest.mark.parametrize("module", sorted(LIGHT_ENTRY_POINTS))
def test_entry_points_stay_light(module):
    """One fresh interpreter each (~1 s): the command line parses its flags, the shared
    cluster's client reads jobs and the XGBoost drop-in imports without what they defer."""
    heavy = LIGHT_ENTRY_POINTS[module]
    probe = f"import sys, {module}; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", f"{module} loads {done.stdout.strip()}"


def test_the_graph_sees_a_cycle_through_an_import_inside_a_function(tmp_path):
    """The checks above can fail: a cycle closed by an import inside a function, under
    a package, is found, and the import is reported unmarked."""
    package = tmp_path / PACKAGE
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "high.py").write_text("from unipar.low.base import VALUE\n")
    (package / "low" / "base.py").write_text(
        textwrap.dedent(
            """
            VALUE = 1

            def upward():
                from unipar import high

                return high
            """
        )
    )
    modules = module_files(tmp_path)
    assert cycles(import_graph(modules)) == [["unipar.high", "unipar.low.base"]]
    assert imports_inside_functions(modules["unipar.low.base"]) == [
        (5, "    from unipar import high")
    ]


def test_lint_imports_counts_an_import_inside_a_function(tmp_path):
    """import-linter (grimp) reads imports inside functions: a layers contract over a
    tiny package fails on one, so `lint-imports` in `make test` sees the hidden ones."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e .[dev])")
    package = tmp_path / "layered"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("import layered.low\n")
    (package / "low.py").write_text("def upward():\n    import layered.high\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = layered\n\n"
        "[importlinter:contract:layers]\nname = layers\ntype = layers\n"
        "layers =\n    layered.high\n    layered.low\n"
    )
    done = subprocess.run(
        [str(lint), "--config", ".importlinter", "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "layered.low is not allowed to import layered.high" in done.stdout
