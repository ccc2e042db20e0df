"""Docs derived from code stay true: every hook is documented and tested, and the generated files are fresh."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from edgeport.scaffold import TEMPLATE_ROOT, iter_hook_specs

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent


def load_gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = [name for name, _ in iter_hook_specs()]


def test_there_are_hooks():
    assert "edgeport_register_backends" in HOOKS and "edgeport_register_kernels" in HOOKS


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_a_docstring(name):
    fn = dict(iter_hook_specs())[name]
    doc = inspect.cleandoc(fn.__doc__ or "")
    assert len(doc.split()) >= 8, f"hook {name} needs a docstring that says when it is called and what to do"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_used_by_a_test(name):
    users = [
        p for p in TESTS.rglob("*.py")
        if p.resolve() != Path(__file__).resolve() and re.search(rf"\bdef {name}\b|\b{name}\b", p.read_text())
    ]
    assert users, f"no test under core/tests implements or calls the hook {name}"


def test_generated_docs_are_fresh():
    gen = load_gen_docs()
    stale = [str(path.relative_to(ROOT)) for path, text in gen.outputs().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated docs {stale}: run python scripts/gen_docs.py"


def test_hook_reference_lists_every_hook():
    text = (ROOT / "docs" / "hooks.md").read_text()
    for name in HOOKS:
        assert f"## {name}" in text


def test_author_guide_covers_the_contract():
    text = (ROOT / "docs" / "backend-authors.md").read_text()
    for needle in ("edgeport new-backend", "BackendConformance", "known_gaps", "edgeport.backends",
                   "EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "EDGEPORT_PLUGINS", "edgeport op-table", "hooks.md",
                   "twine upload", *HOOKS):
        assert needle in text, needle


DOC_SECTIONS = ("## Overview", "## Requirements", "## Partitioner options", "## Op support", "## Quantization",
                "## Troubleshooting")


@pytest.mark.parametrize("page", [ROOT / "docs" / "backends" / "example.md", TEMPLATE_ROOT / "README.md"],
                         ids=["example", "template"])
def test_backend_pages_follow_the_docs_template(page):
    text = page.read_text()
    positions = [text.find(section) for section in DOC_SECTIONS]
    assert all(p >= 0 for p in positions), [s for s, p in zip(DOC_SECTIONS, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "sections out of order"
    assert "<!-- begin generated: op-support" in text and "<!-- end generated: op-support -->" in text


def test_template_readme_op_table_is_fresh():
    import sys

    from edgeport.scaffold import update_generated_block

    sys.path.insert(0, str(TEMPLATE_ROOT / "src"))
    try:
        from edgeport_template.capabilities import BACKEND_ID, CAPABILITIES
    finally:
        sys.path.remove(str(TEMPLATE_ROOT / "src"))
        for name in [m for m in sys.modules if m == "edgeport_template" or m.startswith("edgeport_template.")]:
            del sys.modules[name]
    text = (TEMPLATE_ROOT / "README.md").read_text()
    assert update_generated_block(text, BACKEND_ID, CAPABILITIES) == text
