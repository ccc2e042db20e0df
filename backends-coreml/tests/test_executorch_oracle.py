"""ExecuTorch 1.5.1's own CoreMLPartitioner programs (the test-only oracle) for the models edgeport lowers: its
blobs unflatten with edgeport's reader into what its own ``unflatten_directory_contents`` writes, carry the same
metadata keys, and convert to the same ML program interface as edgeport's."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
from coreml_models import build, load_package, lowered, mil_ops

from edgeport_coreml.describe import describe_coreml_blob
from edgeport_coreml.schema.flat_directory import read_flat_directory

pytestmark = pytest.mark.executorch


def _executorch_blob(name: str) -> bytes:
    pytest.importorskip("executorch.backends.apple.coreml.partition")
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model, x = build(name)
    specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT32,
                                                 minimum_deployment_target=ct.target.iOS16)
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       partitioner=[CoreMLPartitioner(compile_specs=specs)])
    return bytes(edge.exported_program().graph_module.lowered_module_0.processed_bytes)


def _tree(path):
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("name, et_name", [("mlp", "mlp"), ("cnn", "cnn_explicit")])
def test_executorch_blob_reads_with_edgeport(name, et_name):
    from executorch.backends.apple.coreml import executorchcoreml

    blob = _executorch_blob(et_name)
    theirs = tempfile.mkdtemp()
    assert executorchcoreml.unflatten_directory_contents(blob, theirs)
    root, mlmodel = load_package(blob)
    assert _tree(os.path.join(theirs, "lowered_module")) == _tree(root)
    et_meta = json.loads((root / "metadata.json").read_text())
    ours = read_flat_directory(lowered(name).blob())
    our_meta = json.loads(ours.read("metadata.json"))
    assert set(et_meta) == set(our_meta)
    # same layout of the model directory
    et_files = set(read_flat_directory(blob).files)
    assert {f for f in et_files if not f.startswith("debug")} <= set(ours.files) | {"debug_info.json"}
    # same ML program interface and operators
    et_desc, our_desc = describe_coreml_blob(blob), describe_coreml_blob(lowered(name).blob())
    for key in ("specification_version", "model_kind"):
        assert et_desc[key] == our_desc[key]
    assert [(i["shape"], i["dtype"]) for i in et_desc["inputs"]] == [(i["shape"], i["dtype"])
                                                                     for i in our_desc["inputs"]]
    assert [(o["shape"], o["dtype"]) for o in et_desc["outputs"]] == [(o["shape"], o["dtype"])
                                                                      for o in our_desc["outputs"]]
    assert set(mil_ops(mlmodel.get_spec())) - {"const"} == set(our_desc["mil_operators"]) - {"const"}


def test_default_max_pool_stride_fails_in_executorch_but_lowers_in_edgeport():
    """coremltools 9.0 needs max_pool2d's stride as an argument and float clip bounds; ExecuTorch passes the graph
    as exported and fails on the first of the two."""
    with pytest.raises(Exception, match="expected minimum 3 inputs|alpha has dtype int32"):
        _executorch_blob("cnn")
    assert lowered("cnn").num_delegates == 1
