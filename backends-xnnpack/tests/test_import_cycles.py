"""No import cycles between edgeport_xnnpack's modules, and each module imports first in a fresh interpreter.

A cycle made ``import edgeport_xnnpack._native_run`` (and ``_arena``, which imports it) fail unless ``native`` had
been imported before it. The static check reads every module's top-level imports (imports inside functions, which
run on first use, do not count); the subprocess check imports those two modules first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edgeport_xnnpack

PACKAGE = Path(edgeport_xnnpack.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["edgeport_xnnpack", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports at module level (``from pkg import mod`` counts as ``mod``)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
            for a in node.names:  # a submodule, else a name the module defines
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return out


def test_no_module_level_import_cycle():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    edges = {_module_name(p): _top_level_imports(p, modules) - {_module_name(p)} for p in paths}
    assert "edgeport_xnnpack._native_run" in modules and edges["edgeport_xnnpack._native_run"]  # the check sees edges
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            cycle = stack[stack.index(m):] + [m]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if m in done:
            return
        for n in sorted(edges.get(m, ())):
            visit(n, [*stack, m])
        done.add(m)

    for m in sorted(modules):
        visit(m, [])


def test_the_runtime_modules_import_first():
    for module in ("edgeport_xnnpack._native_run", "edgeport_xnnpack._arena"):
        run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"import {module} failed:\n{run.stderr[-2000:]}"
