"""The ``edgeport`` command line."""

from __future__ import annotations

import edgeport
from edgeport import BackendSpec, PreprocessResult, cli, registry


class Unavailable:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(backend_id="NeedsSdk", version="0.3", preprocess=lambda e, s: PreprocessResult(),
                                 is_available=lambda: (False, "libneedssdk.so not found: apt-get install needssdk")))


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
