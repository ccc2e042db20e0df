"""Registration: lazy imports, availability with the install command when Qualcomm's libraries are missing."""

from __future__ import annotations

import subprocess
import sys


def test_registered_and_available(requires_qnn):
    from edgeport.registry import get_backend

    spec = get_backend("QnnBackend")
    ok, why = spec.is_available()
    assert ok and "HTP" in why
    assert spec.capabilities().lookup("aten.convolution.default") is not None


def test_plugin_import_is_light():
    code = ("import sys, edgeport_qnn.plugin, edgeport_qnn.runtime, edgeport_qnn.blob; "
            "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_unavailable_names_the_install_command(monkeypatch):
    from edgeport_qnn import plugin
    from edgeport_qnn.sdk import locate

    def missing(env=None):
        raise locate.QnnLibrariesNotFound("QNN libraries not found")

    monkeypatch.setattr(locate, "find_qnn_libraries", missing)
    ok, why = plugin._available()
    assert not ok and "pip install 'edgeport-qnn[htp]'" in why


def test_registered_quantizers_by_bit_width():
    from edgeport.registry import get_backend
    from edgeport_qnn import QnnQuantizer, QuantDtype

    quantizers = get_backend("QnnBackend").quantizers
    for name, expected in (("uint8", QuantDtype.use_8a8w), ("16a8w", QuantDtype.use_16a8w),
                           ("16a16w", QuantDtype.use_16a16w)):
        q = quantizers[name]()
        assert isinstance(q, QnnQuantizer) and q.quant_dtype == expected
