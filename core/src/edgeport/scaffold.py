"""Tools for backend authors: create a backend package from edgeport's template, and generate its docs.

* :func:`new_backend` - ``edgeport new-backend NAME --dir PATH``: writes a copy-ready backend package (a real tiny
  backend that passes the conformance suite as it is) with every name replaced;
* :func:`op_support_table` / :func:`update_generated_block` - the op-support table of a backend's docs, generated
  from its capability table (``edgeport op-table BACKEND_ID``).

The template is shipped inside the ``edgeport`` distribution (``edgeport/templates/backend/``, package data). It
is a working package named ``template`` (distribution ``edgeport-template``, import ``edgeport_template``,
backend id ``TemplateBackend``); rendering replaces those names, so ``plugins/template/`` in edgeport's repository
is exactly the template rendered for the name ``template`` (a test checks that they never drift).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BackendNames",
    "ScaffoldError",
    "TEMPLATE_ROOT",
    "backend_names",
    "new_backend",
    "op_support_table",
    "render_template",
    "template_files",
    "update_generated_block",
]

TEMPLATE_ROOT = Path(__file__).parent / "templates" / "backend"
_IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "build", "dist"}
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:[_-][a-z0-9]+)*$")


class ScaffoldError(Exception):
    """A backend package could not be created (bad name, destination not empty, ...)."""


@dataclass(frozen=True)
class BackendNames:
    """Every name a backend package uses, derived from one short name (``acme-npu``)."""

    name: str  # as given: "acme-npu"
    ident: str  # "acme_npu": entry-point name and import suffix
    distribution: str  # "edgeport-acme-npu"
    package: str  # "edgeport_acme_npu"
    prefix: str  # "AcmeNpu": class-name prefix (AcmeNpuPartitioner, ...)
    backend_id: str  # "AcmeNpuBackend"


def backend_names(name: str, backend_id: str | None = None) -> BackendNames:
    """The names for ``name`` (lowercase letters, digits, ``-``/``_`` separators; starts with a letter).

    The backend id is the capitalized name plus ``Backend`` (``acmenpu`` -> ``AcmenpuBackend``, ``acme_npu`` ->
    ``AcmeNpuBackend``) unless ``backend_id`` is given (``AcmeNPUBackend``); class names use the id without its
    ``Backend`` suffix.
    """
    if not _NAME_RE.match(name or ""):
        raise ScaffoldError(
            f"backend name {name!r} must be lowercase letters and digits, optionally separated by '-' or '_', "
            "starting with a letter (e.g. 'acmenpu' or 'acme-npu')"
        )
    ident = name.replace("-", "_")
    if keyword.iskeyword(ident):
        raise ScaffoldError(f"backend name {name!r} is a Python keyword")
    parts = re.split(r"[-_]", name)
    if backend_id is None:
        prefix = "".join(p[:1].upper() + p[1:] for p in parts)
        backend_id = f"{prefix}Backend"
    else:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", backend_id) or len(backend_id) > 32:
            raise ScaffoldError(f"backend id {backend_id!r} must be an identifier of at most 32 characters")
        prefix = backend_id.removesuffix("Backend") or backend_id
        if not prefix[:1].isupper():
            prefix = prefix[:1].upper() + prefix[1:]
    if len(backend_id) > 32:
        raise ScaffoldError(f"backend id {backend_id!r} is longer than 32 characters; pass a shorter --backend-id")
    return BackendNames(name, ident, f"edgeport-{name.replace('_', '-')}", f"edgeport_{ident}", prefix, backend_id)


TEMPLATE_NAMES = backend_names("template")


def render_text(text: str, names: BackendNames) -> str:
    """Replace the template's names in one file's text."""
    text = text.replace("edgeport_template", names.package)
    text = text.replace("edgeport-template", names.distribution)
    text = text.replace("TemplateBackend", names.backend_id)
    text = re.sub(r"Template(?=[A-Z])", names.prefix, text)
    text = re.sub(r'\btemplate = "', f'{names.ident} = "', text)
    return text


def render_path(relpath: str, names: BackendNames) -> str:
    return "/".join(names.package if part == "edgeport_template" else part for part in relpath.split("/"))


def _skip(relpath: str) -> bool:
    parts = relpath.split("/")
    return (
        any(p in _IGNORED_PARTS or p.endswith(".egg-info") for p in parts)
        or relpath.endswith((".pyc", ".pyo"))
    )


def template_files(root: Path = TEMPLATE_ROOT) -> dict[str, bytes]:
    """The template's files as ``{relative posix path: bytes}`` (caches and build leftovers excluded)."""
    if not root.is_dir():
        raise ScaffoldError(f"the backend template is missing from this edgeport installation ({root})")
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not _skip(rel):
            files[rel] = path.read_bytes()
    return files


def render_template(names: BackendNames, root: Path = TEMPLATE_ROOT) -> dict[str, bytes]:
    """The package for ``names`` as ``{relative path: bytes}``."""
    return {
        render_path(rel, names): render_text(data.decode("utf-8"), names).encode("utf-8")
        for rel, data in template_files(root).items()
    }


def new_backend(name: str, dest: str | Path, *, backend_id: str | None = None, force: bool = False) -> BackendNames:
    """Write the backend package for ``name`` into the directory ``dest`` (created if needed; must be empty
    unless ``force``, which overwrites the template's files and leaves other files alone)."""
    names = backend_names(name, backend_id)
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ScaffoldError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise ScaffoldError(f"{dest} is not empty; choose an empty or new directory (or pass --force to overwrite)")
    for rel, data in render_template(names).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return names


def compare_with_template(directory: Path, names: BackendNames) -> list[str]:
    """Differences between ``directory`` and the template rendered for ``names`` (empty when identical)."""
    want = render_template(names)
    have = template_files(directory) if directory.is_dir() else {}
    problems = [f"missing: {rel}" for rel in sorted(want.keys() - have.keys())]
    problems += [f"not in the template: {rel}" for rel in sorted(have.keys() - want.keys())]
    problems += [f"differs: {rel}" for rel in sorted(want.keys() & have.keys()) if want[rel] != have[rel]]
    return problems


# -- docs ---------------------------------------------------------------------------------------------------

BEGIN = "<!-- begin generated: {what} (edgeport op-table {backend_id}; do not edit by hand) -->"
END = "<!-- end generated: {what} -->"


def _constraint_text(cap: Any) -> str:
    fn = cap.constraint
    if fn is None:
        return ""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    return doc[0] if doc else f"checked by `{getattr(fn, '__name__', 'constraint')}`"


def op_support_table(table: Any) -> str:
    """The markdown op-support table of a :class:`~edgeport.CapabilityTable` (one row per claimed op)."""
    rows = ["| operator | dtypes | notes |", "|---|---|---|"]
    for cap in table.ops:
        dtypes = ", ".join(cap.dtypes) if cap.dtypes else "any"
        notes = "; ".join(t for t in (cap.notes, _constraint_text(cap)) if t)
        rows.append(f"| `{cap.op}` | {dtypes} | {notes.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def generated_block(backend_id: str, table: Any, what: str = "op-support") -> str:
    return (
        BEGIN.format(what=what, backend_id=backend_id)
        + f"\n\n{len(table.ops)} operators.\n\n"
        + op_support_table(table)
        + "\n"
        + END.format(what=what)
    )


def update_generated_block(text: str, backend_id: str, table: Any, what: str = "op-support") -> str:
    """Replace the generated block of ``text`` (between its begin/end markers) with a fresh table."""
    pattern = re.compile(
        re.escape("<!-- begin generated: " + what) + r".*?" + re.escape(END.format(what=what)), re.DOTALL
    )
    if not pattern.search(text):
        raise ScaffoldError(
            f"no generated {what} block found; add the two marker lines\n"
            f"{BEGIN.format(what=what, backend_id=backend_id)}\n{END.format(what=what)}"
        )
    return pattern.sub(lambda _: generated_block(backend_id, table, what), text, count=1)


def iter_hook_specs() -> Iterable[tuple[str, Any]]:
    """``(name, function)`` of every hook spec in :mod:`edgeport.hookspecs`, in source order."""
    import inspect

    from edgeport import hookspecs

    functions = [
        (name, fn) for name, fn in vars(hookspecs).items()
        if name.startswith("edgeport_") and inspect.isfunction(fn)
    ]
    return sorted(functions, key=lambda item: item[1].__code__.co_firstlineno)
