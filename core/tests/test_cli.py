"""The ``edgeport`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import importlib_metadata
import pytest

import edgeport
from edgeport import BackendSpec, PreprocessResult, cli, registry


class Unavailable:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(backend_id="NeedsSdk", version="0.3", preprocess=lambda e, s: PreprocessResult(),
                                 is_available=lambda: (False, "libneedssdk.so not found: apt-get install needssdk")))


class AvailableWithNote:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(backend_id="Noted", version="1.0", preprocess=lambda e, s: PreprocessResult(),
                                 is_available=lambda: (True, "slow path: the C helper is not built")))


class Broken:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        raise ImportError("no module named vendor_sdk")


def test_backends_lists_ids_availability_and_broken_plugins(capsys, recwarn):
    registry.reload_plugins()
    try:
        edgeport.register_plugin(Unavailable(), name="needs-sdk")
        edgeport.register_plugin(Broken(), name="broken-vendor")
        code = cli.main(["backends"])
        out = capsys.readouterr().out
    finally:
        registry.reload_plugins()
    assert "NeedsSdk  version 0.3" in out
    assert "unavailable: libneedssdk.so not found" in out
    assert "BROKEN plugin 'broken-vendor'" in out and "vendor_sdk" in out
    assert code == 1


def test_doctor_reports_torch_and_fixes(capsys, recwarn):
    registry.reload_plugins()
    try:
        edgeport.register_plugin(Broken(), name="broken-vendor")
        code = cli.main(["doctor"])
        out = capsys.readouterr().out
    finally:
        registry.reload_plugins()
    assert "torch: 2.13.0" in out
    assert "plugin error" in out and "Fix:" in out
    assert code == 1


# -- listing installed backends (entry points) -----------------------------------------------------------------

HAS_EXAMPLE = any(ep.name == "example" for ep in importlib_metadata.entry_points(group="edgeport.backends"))
needs_example = pytest.mark.skipif(not HAS_EXAMPLE, reason="edgeport-example is not installed")


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Plugins rediscovered under the test's environment, and again afterwards."""
    monkeypatch.delenv("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("EDGEPORT_PLUGINS", raising=False)
    registry.reload_plugins()
    yield monkeypatch
    monkeypatch.undo()
    registry.reload_plugins()


@needs_example
def test_backends_shows_version_distribution_plugin_and_op_count(fresh_plugins, capsys):
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "ExampleBackend  version 0.1.0  distribution edgeport-example  plugin example  ops 9  available" in out


@needs_example
def test_backends_json(fresh_plugins, capsys):
    edgeport.register_plugin(Unavailable(), name="needs-sdk")
    cli.main(["backends", "--json"])
    data = json.loads(capsys.readouterr().out)
    rows = {r["backend_id"]: r for r in data["backends"]}
    assert rows["ExampleBackend"]["ops"] == 9 and rows["ExampleBackend"]["plugin"] == "example"
    assert rows["NeedsSdk"]["available"] is False and "libneedssdk" in rows["NeedsSdk"]["reason"]
    assert rows["NeedsSdk"]["plugin"] == "(script)"
    assert data["broken"] == [] and data["not_loaded"] == []


@needs_example
def test_disable_plugin_autoload(fresh_plugins, capsys):
    fresh_plugins.setenv("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry.reload_plugins()
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "ExampleBackend  version" not in out
    assert "NOT LOADED plugin 'example' (distribution edgeport-example): EDGEPORT_DISABLE_PLUGIN_AUTOLOAD is set" in out
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "environment: EDGEPORT_DISABLE_PLUGIN_AUTOLOAD=1" in out
    assert "plugin example (edgeport-example): installed but not loaded" in out


@needs_example
def test_edgeport_plugins_selects_entry_points(fresh_plugins, capsys):
    fresh_plugins.setenv("EDGEPORT_PLUGINS", "example")
    registry.reload_plugins()
    cli.main(["backends"])
    out = capsys.readouterr().out
    assert "ExampleBackend  version" in out and "NOT LOADED plugin 'example'" not in out

    fresh_plugins.setenv("EDGEPORT_PLUGINS", "nosuchplugin")
    registry.reload_plugins()
    cli.main(["backends"])
    out = capsys.readouterr().out
    assert "ExampleBackend  version" not in out
    assert "NOT LOADED plugin 'example' (distribution edgeport-example): EDGEPORT_PLUGINS=nosuchplugin" in out
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM EDGEPORT_PLUGINS names ['nosuchplugin'], which no installed distribution provides" in out


@needs_example
def test_console_script_honours_the_switches():
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEPORT_")}
    script = [sys.executable, "-c", "import sys; from edgeport.cli import main; sys.exit(main(['backends']))"]
    done = subprocess.run(script, env={**env, "EDGEPORT_PLUGINS": "example"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "ExampleBackend" in done.stdout, done.stderr
    done = subprocess.run(script, env={**env, "EDGEPORT_DISABLE_PLUGIN_AUTOLOAD": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert "ExampleBackend  version" not in done.stdout and "NOT LOADED plugin 'example'" in done.stdout


def test_doctor_names_missing_system_libraries_and_their_packages(fresh_plugins, capsys):
    fresh_plugins.setattr(cli.ctypes.util, "find_library", lambda name: None)
    fresh_plugins.setattr(cli.glob, "glob", lambda pattern: [])
    fresh_plugins.setattr(cli, "_installed", lambda dist: dist == "edgeport-xnnpack")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM library XNNPACK (XNNPACK (CPU kernels)) not found; edgeport-xnnpack needs it. " \
           "Fix: apt-get install libxnnpack0" in out
    assert "Fix: apt-get install libpthreadpool0" in out
    assert "library vulkan: not found (only edgeport-vulkan needs it; apt package libvulkan1)" in out
    assert "mesa-vulkan-drivers" in out


def test_doctor_reports_found_libraries(fresh_plugins, capsys):
    fresh_plugins.setattr(cli.ctypes.util, "find_library", lambda name: f"lib{name}.so.0")
    fresh_plugins.setattr(cli.glob, "glob", lambda pattern: ["/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"])
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "library XNNPACK: found (libXNNPACK.so.0)" in out
    assert "vulkan CPU driver (lavapipe): found" in out


def test_doctor_reports_unavailable_backends_with_their_reason(fresh_plugins, capsys):
    edgeport.register_plugin(Unavailable(), name="needs-sdk")
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "PROBLEM backend NeedsSdk (script) is unavailable: libneedssdk.so not found: apt-get install needssdk" in out


def test_available_backends_show_their_note(fresh_plugins, capsys):
    """``is_available`` may return a note with ``True`` (e.g. a slower fallback in use): listed, not a problem."""
    edgeport.register_plugin(AvailableWithNote(), name="noted")
    cli.main(["backends"])
    assert "available (slow path: the C helper is not built)" in capsys.readouterr().out
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "backend Noted: available (slow path: the C helper is not built)" in out
    assert "PROBLEM backend Noted" not in out


@needs_example
def test_op_table(fresh_plugins, capsys, tmp_path):
    assert cli.main(["op-table", "ExampleBackend"]) == 0
    out = capsys.readouterr().out
    assert "| `aten.permute_copy.default` | float32 | 2-D transpose only" in out
    doc = tmp_path / "backend.md"
    doc.write_text("# ExampleBackend\n\n<!-- begin generated: op-support -->\nold\n<!-- end generated: op-support -->\n")
    assert cli.main(["op-table", "ExampleBackend", "--check", str(doc)]) == 1
    assert cli.main(["op-table", "ExampleBackend", "--update", str(doc)]) == 0
    assert cli.main(["op-table", "ExampleBackend", "--check", str(doc)]) == 0
    assert "| `aten.mm.default` | float32 |" in doc.read_text()
    assert cli.main(["op-table", "NoSuchBackend"]) == 2
    assert "is not installed" in capsys.readouterr().err


def test_doctor_reports_a_platform_bound_backend_without_calling_it_a_problem(capsys):
    """A backend whose executor runs only on another OS (Core ML) is lowering-only here, not a problem."""
    import sys as _sys

    from edgeport.backend import BackendSpec

    class _Plugin:
        @edgeport.hookimpl
        def edgeport_register_backends(self, registry):
            registry.add(BackendSpec(backend_id="ElsewhereBackend", version="0", preprocess=lambda *a: None,
                                     is_available=lambda: (False, "runs on another OS"),
                                     execution_platforms=("not-" + _sys.platform,)))

    registry.reload_plugins()
    try:
        edgeport.register_plugin(_Plugin(), name="elsewhere")
        cli.main(["doctor"])
        out = capsys.readouterr().out
    finally:
        registry.reload_plugins()
    line = next(x for x in out.splitlines() if "ElsewhereBackend" in x)
    assert line.startswith("backend ElsewhereBackend: lowering only on this platform") and "PROBLEM" not in line


class WithCommand:
    """A plugin adding ``edgeport hello NAME [--shout]`` and one whose command cannot be set up."""

    @edgeport.hookimpl
    def edgeport_register_commands(self, registry):
        def configure(parser):
            parser.add_argument("name")
            parser.add_argument("--shout", action="store_true")

        def run(args):
            text = f"hello {args.name}"
            print(text.upper() if args.shout else text)
            return 3

        def configure_broken(parser):
            raise RuntimeError("vendor tool missing")

        registry.add(edgeport.CommandSpec("hello", "greet someone", configure, run))
        registry.add(edgeport.CommandSpec("broken", "never works", configure_broken, run))


class ClaimsBuiltin:
    @edgeport.hookimpl
    def edgeport_register_commands(self, registry):
        registry.add(edgeport.CommandSpec("inspect", "steal inspect", lambda p: None, lambda a: 0))


def test_plugin_commands_run_and_broken_ones_say_why(capsys, recwarn):
    registry.reload_plugins()
    try:
        edgeport.register_plugin(WithCommand(), name="with-command")
        assert cli.main(["hello", "ada", "--shout"]) == 3
        assert capsys.readouterr().out.strip() == "HELLO ADA"
        assert cli.main(["broken"]) == 2
        err = capsys.readouterr().err
        assert "edgeport broken" in err and "vendor tool missing" in err
        assert cli.main(["backends"]) == 0  # built-in commands unaffected
    finally:
        registry.reload_plugins()


def test_a_plugin_cannot_take_a_builtin_command_name(capsys, recwarn):
    registry.reload_plugins()
    try:
        edgeport.register_plugin(ClaimsBuiltin(), name="claims-builtin")
        failures = registry.plugin_errors()
        assert any("'inspect' is built into edgeport" in f.error for f in failures)
        assert "steal inspect" not in cli.build_parser().format_help()
    finally:
        registry.reload_plugins()
