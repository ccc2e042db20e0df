"""Oracle: edgeport-qnn against ONNX Runtime's QNN execution provider on the same QNN HTP libraries (and eager).

ONNX Runtime's QNN EP (the ``onnxruntime-qnn`` wheel that also provides edgeport-qnn's libraries) is what a
Qualcomm user would otherwise pick. The same models are exported to ONNX (``torch.onnx.export(dynamo=False)``) and
run by ``onnxruntime.InferenceSession`` with every node on QNN (``session.disable_cpu_ep_fallback=1``: session
creation fails if any node would fall back to ONNX Runtime's CPU EP).

How ORT-QNN is configured (onnxruntime 1.32 + onnxruntime-qnn 2.7.0): the QNN EP is a *plugin* EP; it is absent
from ``get_available_providers()`` and ``providers=["QNNExecutionProvider"]`` silently ends up on the CPU EP. It
is registered with ``register_execution_provider_library`` and selected with ``add_provider_for_devices``. Options:
``backend_path`` = the wheel's ``libQnnHtp.so``, ``htp_arch=75`` (the SM8650's HTP, edgeport's default SoC) and
*no* ``soc_model``: with ``soc_model`` set the EP runs fp32 graphs in HTP fp16 precision (4.6e-3 off on the MLP)
whatever ``enable_htp_fp16_precision`` says, and that setting then sticks to later sessions of the same process.

Test-only dependency: ``onnx`` (``scripts/install.d/qnn.sh``); onnxruntime is never imported by edgeport itself.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings

import numpy as np
import pytest
import torch
from qnn_models import build

import edgeport
from edgeport.runtime import Runtime

pytestmark = pytest.mark.usefixtures("requires_qnn")

EDGEPORT_TOL = 1e-4  # relative to the output's scale, vs eager (the brief's bound)
# Measured here: ORT-QNN vs eager 2.3e-7 (MLP) / 1.8e-7 (CNN), edgeport vs ORT-QNN 0 / 1.8e-7 -- run to run the
# same. 1e-5 is ~50x that and still 100x below what HTP fp16 precision gives (2e-4..5e-3), so it catches fp16.
ORT_TOL = 1e-5


def ort_qnn_options() -> dict[str, str]:
    import onnxruntime_qnn

    return {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "htp_arch": "75"}


@pytest.fixture(scope="module")
def ort_qnn():
    """A function ``(onnx_path) -> InferenceSession`` on ORT's QNN EP with CPU fallback disabled; skips if absent."""
    for mod in ("onnx", "onnxruntime", "onnxruntime_qnn"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"ONNX Runtime's QNN EP oracle needs the '{mod}' package (pip install onnx "
                        "'edgeport-qnn[htp]'; scripts/install.d/qnn.sh installs both)")
    import onnxruntime as ort
    import onnxruntime_qnn

    ep = onnxruntime_qnn.get_ep_name()
    try:
        ort.register_execution_provider_library(ep, onnxruntime_qnn.get_library_path())
    except Exception as e:  # noqa: BLE001 -- already registered is fine, anything else: skip with the reason
        if "already registered" not in str(e).lower():
            pytest.skip(f"ONNX Runtime cannot load its QNN execution provider here: {e}")
    devices = [d for d in ort.get_ep_devices() if d.ep_name == ep]
    if not devices:
        pytest.skip("ONNX Runtime's QNN execution provider reports no device here")

    def session(path: str):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.add_provider_for_devices(devices, ort_qnn_options())
        s = ort.InferenceSession(path, so)
        assert s.get_providers()[0] == "QNNExecutionProvider"
        return s

    return session


def to_onnx(model, inputs, path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, path, dynamo=False, opset_version=17)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_edgeport_vs_ort_qnn_vs_eager(name, ort_qnn, record_property):
    from edgeport_qnn import QnnPartitioner

    model, inputs = build(name)
    eager = model(*inputs).detach().numpy()

    pte = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs),
                                               partitioner=[QnnPartitioner()]).to_executorch()
    method = Runtime.get().load_program(pte.buffer).load_method("forward")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        to_onnx(model, inputs, path)
        sess = ort_qnn(path)
    feed = {sess.get_inputs()[0].name: inputs[0].numpy()}

    # twice each, interleaved: both share the process's HTP backend, neither may disturb the other
    results = []
    for _ in range(2):
        (ours,) = method.execute([x.numpy() for x in inputs])
        (theirs,) = sess.run(None, feed)
        results.append((np.asarray(ours), np.asarray(theirs)))
    (ours, theirs), (ours2, theirs2) = results
    np.testing.assert_array_equal(ours, ours2)
    np.testing.assert_array_equal(theirs, theirs2)

    e_ours, e_theirs, e_between = rel(ours, eager), rel(theirs, eager), rel(ours, theirs)
    record_property("edgeport_vs_eager", e_ours)
    record_property("ort_qnn_vs_eager", e_theirs)
    record_property("edgeport_vs_ort_qnn", e_between)
    print(f"{name}: edgeport vs eager {e_ours:.2e}, ORT-QNN vs eager {e_theirs:.2e}, edgeport vs ORT-QNN "
          f"{e_between:.2e}")
    assert ours.shape == theirs.shape == eager.shape
    assert e_ours <= EDGEPORT_TOL, f"edgeport-qnn {e_ours:.3g} off eager"
    assert e_theirs <= ORT_TOL, f"ORT-QNN {e_theirs:.3g} off eager (HTP fp16 precision?)"
    assert e_between <= ORT_TOL, f"edgeport-qnn and ORT-QNN differ by {e_between:.3g}"
