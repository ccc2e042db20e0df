"""An MLP and a small CNN lowered by edgeport to CoreMLBackend: every package coremltools loads (uncompiled), its
ML program has the partition's ops, inputs and outputs, and its weights are the model's (fp32 bit-exact, fp16
within rounding). ExecuTorch's ``unflatten_directory_contents`` unpacks the blobs into the same tree as ours.
Execution needs Core ML (macOS): here loading the program is refused, naming the backend."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
from coreml_models import load_package, lowered, mil_consts, mil_ops

from edgeport.errors import BackendNotFoundError
from edgeport.runtime import Runtime
from edgeport_coreml.describe import describe_coreml_blob
from edgeport_coreml.schema.flat_directory import read_flat_directory

EXPECTED_OPS = {"mlp": {"linear", "relu", "tanh"}, "cnn": {"conv", "relu", "max_pool", "clip", "add", "reduce_mean",
                                                           "linear", "softmax"}}


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_whole_model_is_one_core_ml_delegate(name):
    low = lowered(name)
    assert low.partitioner.rejections == {}
    assert low.num_delegates == 1
    flat = read_flat_directory(low.blob())
    assert flat.root_name == "lowered_module"
    assert {"metadata.json", "model.mlpackage/Manifest.json",
            "model.mlpackage/Data/com.apple.CoreML/model.mlmodel"} <= set(flat.files)
    meta = json.loads(flat.read("metadata.json"))
    assert set(meta) == {"inputNames", "outputNames", "identifier"}
    assert meta["identifier"].startswith("executorch_")


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_package_loads_and_matches_the_partition(name):
    low = lowered(name)
    root, mlmodel = load_package(low.blob())
    spec = mlmodel.get_spec()
    assert spec.WhichOneof("Type") == "mlProgram" and spec.specificationVersion == 7  # iOS16
    (inp,), (out,) = spec.description.input, spec.description.output
    meta = json.loads((root / "metadata.json").read_text())
    assert meta["inputNames"] == [inp.name] and meta["outputNames"] == [out.name]
    assert list(inp.type.multiArrayType.shape) == list(low.example.shape)
    expected_out = low.model(low.example).shape
    assert list(out.type.multiArrayType.shape) == list(expected_out)
    assert inp.type.multiArrayType.dataType == out.type.multiArrayType.dataType == 65568  # FLOAT32
    ops = set(mil_ops(spec)) - {"const"}
    assert EXPECTED_OPS[name] <= ops, ops


def _assert_weights_inside(model, consts, exact):
    for pname, p in model.named_parameters():
        want = p.detach().numpy()
        found = False
        for c in consts:
            if c.size != want.size:
                continue
            if exact and c.dtype == np.float32 and np.array_equal(c.reshape(want.shape), want):
                found = True
            elif not exact and c.dtype == np.float16 and np.array_equal(c.reshape(want.shape),
                                                                          want.astype(np.float16)):
                found = True
        assert found, f"parameter {pname} {tuple(want.shape)} is not among the ML program's constants"


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_fp32_weights_are_bit_exact(name):
    low = lowered(name, "float32")
    root, mlmodel = load_package(low.blob())
    _assert_weights_inside(low.model, mil_consts(root / "model.mlpackage", mlmodel.get_spec()), exact=True)


def test_fp16_weights_are_rounded_model_weights():
    low = lowered("mlp", "float16")
    root, mlmodel = load_package(low.blob())
    consts = mil_consts(root / "model.mlpackage", mlmodel.get_spec())
    assert any(c.dtype == np.float16 for c in consts)
    _assert_weights_inside(low.model, consts, exact=False)
    fp32 = read_flat_directory(lowered("mlp", "float32").blob())
    fp16 = read_flat_directory(low.blob())
    w = "model.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
    assert len(fp16.files[w]) < len(fp32.files[w])


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_describe_blob(name):
    low = lowered(name)
    d = describe_coreml_blob(low.blob())
    assert d["specification_version"] == 7 and d["model_kind"] == "mlProgram"
    assert d["inputs"][0]["shape"] == list(low.example.shape) and d["inputs"][0]["dtype"] == "float32"
    assert "model.mlpackage/Manifest.json" in d["files"]
    assert set(EXPECTED_OPS[name]) <= set(d["mil_operators"])
    json.dumps(d)


def test_lowering_is_reproducible():
    import torch
    from coreml_models import build

    from edgeport import to_edge_transform_and_lower
    from edgeport_coreml import CoreMLPartitioner, generate_compile_specs

    model, x = build("mlp")
    ep = torch.export.export(model, (x,))
    again = to_edge_transform_and_lower(ep, partitioner=[CoreMLPartitioner(generate_compile_specs(
        compute_precision="float32", minimum_deployment_target="iOS16"))]).to_executorch().buffer
    from edgeport.program.reader import load_pte

    first = read_flat_directory(lowered("mlp").blob())
    second = read_flat_directory(bytes(load_pte(bytes(again)).delegate_data(0, 0)))
    assert json.loads(first.read("metadata.json")) == json.loads(second.read("metadata.json"))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_loading_the_program_off_macos_names_the_backend(name):
    from edgeport_coreml.runtime import coreml_available

    if coreml_available()[0]:
        pytest.skip("Core ML is available here")
    with pytest.raises(BackendNotFoundError, match=r"CoreMLBackend.*Core ML runs on macOS 13\+/iOS 16\+"):
        Runtime.get().load_program(lowered(name).program).load_method("forward")


def _tree(path):
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


@pytest.mark.executorch
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_executorch_unflattens_edgeport_blobs(name):
    executorchcoreml = pytest.importorskip("executorch.backends.apple.coreml.executorchcoreml")
    blob = lowered(name).blob()
    theirs, ours = tempfile.mkdtemp(), tempfile.mkdtemp()
    assert executorchcoreml.unflatten_directory_contents(blob, theirs)
    root, _ = load_package(blob, ours)
    assert os.listdir(theirs) == ["lowered_module"]
    assert _tree(os.path.join(theirs, "lowered_module")) == _tree(root)
    # and ExecuTorch's flattening of that tree reads back identically with edgeport's reader
    again = read_flat_directory(executorchcoreml.flatten_directory_contents(os.path.join(theirs, "lowered_module")))
    assert {k: bytes(v) for k, v in again.files.items()} == {k: bytes(v) for k, v in
                                                             read_flat_directory(blob).files.items()}
