"""Finding the libraries, and our ABI declarations (layouts checked against QNN by the round-trip tests)."""

from __future__ import annotations

import ctypes as C
import importlib.util
import subprocess
import sys

import pytest

from edgeport_qnn.sdk import abi, error_name, locate
from edgeport_qnn.sdk.interface import BACKEND_TABLE_ORDER, BackendTable, BinaryInfoV3, GraphInfo


def test_sdk_root_is_preferred(tmp_path):
    lib = tmp_path / "lib" / "x86_64-linux-clang"
    lib.mkdir(parents=True)
    for name in ("libQnnSystem.so", "libQnnHtp.so", "libQnnCpu.so"):
        (lib / name).write_bytes(b"")
    found = locate.find_qnn_libraries({"QNN_SDK_ROOT": str(tmp_path)})
    assert found.source == "QNN_SDK_ROOT" and found.directory == lib
    assert set(found.backends) == {"htp", "cpu"} and found.system == lib / "libQnnSystem.so"
    with pytest.raises(locate.QnnLibrariesNotFound, match="gpu"):
        found.backend("gpu")
    with pytest.raises(ValueError):
        found.backend("npu")


def test_missing_libraries_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(locate, "_wheel_directory", lambda: None)
    with pytest.raises(locate.QnnLibrariesNotFound) as info:
        locate.find_qnn_libraries({"QNN_SDK_ROOT": str(tmp_path)})
    message = str(info.value)
    assert "pip install 'edgeport-qnn[htp]'" in message and "QNN_SDK_ROOT" in message
    assert locate.qnn_available() is False


def test_wheel_is_found_without_importing_onnxruntime_or_torch(requires_qnn, tmp_path):
    if importlib.util.find_spec("onnxruntime_qnn") is None:
        pytest.skip("the QNN libraries come from QNN_SDK_ROOT here, not from onnxruntime-qnn")
    found = locate.find_qnn_libraries({"QNN_SDK_ROOT": str(tmp_path)})  # an empty SDK root falls through
    assert found.source == "onnxruntime-qnn" and "htp" in found.backends
    assert found.qnn_version and found.qnn_version.startswith("2.")
    script = ("import sys; from edgeport_qnn.sdk import QnnBackend, find_qnn_libraries; find_qnn_libraries(); "
              "QnnBackend.load('htp').close(); "
              "assert not {'torch', 'onnxruntime', 'onnxruntime_qnn'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-1000:]


def test_struct_layouts_match_the_64_bit_abi():
    assert C.sizeof(abi.QuantizeParams) == 40
    assert C.sizeof(abi.TensorV1) == 112 and C.sizeof(abi.TensorV2) == 136 and C.sizeof(abi.Tensor) == 144
    assert abi.TensorV1.dimensions.offset == 80 and abi.TensorV1.mem_type.offset == 88
    assert abi.Tensor.u.offset == 8 and C.sizeof(abi.Param) == 160 and abi.Param.u.offset == 16
    assert C.sizeof(abi.Scalar) == 16 and C.sizeof(abi.OpConfigV1) == 72 and C.sizeof(abi.OpConfig) == 80
    assert len(BACKEND_TABLE_ORDER) == len(set(BACKEND_TABLE_ORDER)) == 56
    assert BackendTable.backendValidateOpConfig.offset == 7 * 8 and BackendTable.graphExecute.offset == 21 * 8
    assert BackendTable.deviceCreate.offset == 40 * 8 and BackendTable.errorGetMessage.offset == 48 * 8
    assert BinaryInfoV3.graphs.offset == 96 and C.sizeof(GraphInfo) == 88  # stride checked by 2-graph binaries


def test_error_names_and_codes():
    assert abi.error_code(0x1234_0000_0FA5) == 4005
    assert error_name(4005) == "QNN_BACKEND_ERROR_OP_PACKAGE_NOT_FOUND"
    assert error_name(6004) == "QNN_GRAPH_ERROR_INVALID_TENSOR"
    assert error_name(5004) == "QNN_CONTEXT_ERROR_BINARY_VERSION"
    assert error_name(30010) == "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY"
    assert error_name(12345) == "QNN_ERROR_12345"


def test_backend_reports_its_versions(backend):
    assert backend.backend_id == abi.BACKEND_ID_HTP and backend.provider_name == "HTP_QTI_AISW"
    core, _ = backend.api_version
    assert core.startswith("2.") and backend.build_id.startswith("v2.")
