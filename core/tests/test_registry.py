"""Plugin discovery: entry points, user-script plugins, broken plugins, and the not-installed error."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

import edgeport
from edgeport import BackendSpec, PreprocessResult, registry


def _spec(backend_id: str) -> BackendSpec:
    return BackendSpec(backend_id=backend_id, version="1.0", preprocess=lambda ep, specs: PreprocessResult(b""))


class GoodPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(_spec("GoodBackend"))


class BrokenPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        raise RuntimeError("vendor SDK exploded")


@pytest.fixture
def fresh_registry(monkeypatch):
    registry.reload_plugins()
    yield
    registry.reload_plugins()


def test_register_plugin_from_a_script(fresh_registry):
    edgeport.register_plugin(GoodPlugin(), name="good")
    assert edgeport.get_backend("GoodBackend").version == "1.0"
    assert "GoodBackend" in [s.backend_id for s in edgeport.list_backends()]


def test_broken_hook_is_reported_and_does_not_hide_others(fresh_registry):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        edgeport.register_plugin(BrokenPlugin(), name="broken")
        edgeport.register_plugin(GoodPlugin(), name="good")
    errors = edgeport.plugin_errors()
    assert [e.plugin for e in errors] == ["broken"]
    assert "vendor SDK exploded" in errors[0].error
    assert any("vendor SDK exploded" in str(w.message) for w in caught)
    assert edgeport.get_backend("GoodBackend").backend_id == "GoodBackend"


def test_missing_backend_names_installed_ones_and_the_package(fresh_registry, monkeypatch):
    monkeypatch.setitem(registry.KNOWN_BACKEND_PACKAGES, "AcmeNpuBackend", "edgeport-acmenpu")
    edgeport.register_plugin(GoodPlugin(), name="good")
    with pytest.raises(edgeport.BackendNotFoundError) as info:
        edgeport.get_backend("AcmeNpuBackend")
    message = str(info.value)
    assert "GoodBackend" in message and "pip install edgeport-acmenpu" in message


def test_duplicate_backend_id_is_reported(fresh_registry):
    class Again(GoodPlugin):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edgeport.register_plugin(GoodPlugin(), name="good")
        edgeport.register_plugin(Again(), name="again")
    assert any("registered twice" in e.error for e in edgeport.plugin_errors())


def _fake_distribution(tmp_path, name: str, module_body: str, module: str) -> None:
    dist = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"  # dist-info folder names use underscores
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[edgeport.backends]\n{name} = {module}\n")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(module_body))


def test_entry_point_plugins_discovered_and_import_errors_reported(tmp_path, monkeypatch, fresh_registry):
    _fake_distribution(tmp_path, "acme-ok", """
        import edgeport
        @edgeport.hookimpl
        def edgeport_register_backends(registry):
            registry.add(edgeport.BackendSpec(backend_id="AcmeBackend", version="2.0",
                                              preprocess=lambda ep, specs: edgeport.PreprocessResult(b"")))
    """, "acme_ok_plugin")
    _fake_distribution(tmp_path, "acme-broken", "import not_a_real_module_xyz\n", "acme_broken_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        spec = edgeport.get_backend("AcmeBackend")
    assert spec.distribution == "acme-ok"
    failures = edgeport.plugin_errors()
    assert [(f.plugin, f.distribution, f.stage) for f in failures] == [("acme-broken", "acme-broken", "import")]
    assert "not_a_real_module_xyz" in failures[0].error
    sys.modules.pop("acme_ok_plugin", None)


def test_environment_switches(tmp_path, monkeypatch, fresh_registry):
    _fake_distribution(tmp_path, "acme-ok", """
        import edgeport
        @edgeport.hookimpl
        def edgeport_register_backends(registry):
            registry.add(edgeport.BackendSpec(backend_id="AcmeBackend", version="2.0",
                                              preprocess=lambda ep, specs: edgeport.PreprocessResult(b"")))
    """, "acme_ok_plugin2")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry.reload_plugins()
    assert "AcmeBackend" not in [s.backend_id for s in edgeport.list_backends()]
    monkeypatch.delenv("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("EDGEPORT_PLUGINS", "someone-else")
    registry.reload_plugins()
    assert "AcmeBackend" not in [s.backend_id for s in edgeport.list_backends()]
    monkeypatch.setenv("EDGEPORT_PLUGINS", "acme-ok")
    registry.reload_plugins()
    assert "AcmeBackend" in [s.backend_id for s in edgeport.list_backends()]
    sys.modules.pop("acme_ok_plugin2", None)


def test_import_edgeport_does_not_import_torch():
    import subprocess

    code = "import sys, edgeport; edgeport.list_backends(); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
