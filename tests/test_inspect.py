"""``edgeport inspect`` and backends' ``describe_blob`` on edgeport's and ExecuTorch's programs.

Oracles: ExecuTorch's own program objects (``manager.executorch_program``: its delegates, operators and methods)
for its files; eager shapes and the program tables for ours; the file size for the section sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import edgeport
from edgeport import to_edge, to_edge_transform_and_lower
from edgeport.inspection import format_inspection, inspect_program
from edgeport.testing.models import cnn_bn_pool, two_linear

xnnpack = pytest.importorskip("edgeport_xnnpack")


def _edgeport(model_fn, path: str) -> bytes:
    model, example = model_fn()
    ep = torch.export.export(model.eval(), example)
    if path == "portable":
        return to_edge(ep).to_executorch().buffer
    return to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()]).to_executorch().buffer


@pytest.mark.parametrize("path", ["portable", "xnnpack"])
def test_sections_add_up_and_shapes_match_eager(path):
    model, example = cnn_bn_pool()
    info = inspect_program(_edgeport(cnn_bn_pool, path))
    assert sum(info["sections"].values()) == info["file_bytes"]
    assert all(v >= 0 for v in info["sections"].values())
    (method,) = info["methods"]
    with torch.no_grad():
        out = model.eval()(*example)
    assert method["inputs"] == [{"kind": "tensor", "dtype": "float", "shape": list(example[0].shape)}]
    assert method["outputs"] == [{"kind": "tensor", "dtype": "float", "shape": list(out.shape)}]
    if path == "xnnpack":
        (delegate,) = method["delegates"]
        desc = delegate["description"]
        assert desc["inputs"][0]["dims"] == list(example[0].shape) and desc["ops"]["XNNConv2d"] == 2
        assert desc["named_data_bytes"] == info["sections"]["named_data"]
    else:
        assert method["instructions"]["KernelCall"] == sum(method["operators"].values())


@pytest.mark.executorch
@pytest.mark.parametrize("path", ["portable", "xnnpack"])
def test_executorch_programs_are_described_as_executorch_sees_them(path):
    pytest.importorskip("executorch")
    from executorch.exir import to_edge as et_to_edge
    from executorch.exir import to_edge_transform_and_lower as et_lower

    model, example = two_linear()
    ep = torch.export.export(model.eval(), example)
    if path == "portable":
        manager = et_to_edge(ep).to_executorch()
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack

        manager = et_lower(ep, partitioner=[EtXnnpack()]).to_executorch()
    info = inspect_program(manager.buffer)
    theirs = manager.executorch_program.execution_plan[0]
    (method,) = info["methods"]
    assert method["name"] == theirs.name
    assert [d["backend"] for d in method["delegates"]] == [d.id for d in theirs.delegates]
    their_ops = {f"{o.name}.{o.overload}" if o.overload else o.name for o in theirs.operators}
    assert set(method["operators"]) <= their_ops
    for d in method["delegates"]:
        assert "error" not in d["description"], d["description"]
        assert d["description"]["ops"].get("XNNFullyConnected", 0) >= 1
    assert format_inspection(info).startswith("program: ")


def test_cli_prints_json_and_refuses_a_bad_file_without_a_traceback(tmp_path):
    pte = tmp_path / "model.pte"
    pte.write_bytes(_edgeport(two_linear, "xnnpack"))
    done = subprocess.run([sys.executable, "-m", "edgeport.cli", "inspect", str(pte), "--json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["methods"][0]["delegates"][0]["backend"] == "XnnpackBackend"
    bad = tmp_path / "bad.pte"
    bad.write_bytes(pte.read_bytes()[:200])
    done = subprocess.run([sys.executable, "-m", "edgeport.cli", "inspect", str(bad)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "is not a valid program" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("backend_id", ["XnnpackBackend", "ExampleBackend"])
@pytest.mark.parametrize("garbage", [b"", b"\x00" * 64, b"XH00" * 40, bytes(range(256)) * 4])
def test_describe_blob_refuses_garbage_with_value_error(backend_id, garbage):
    describe = edgeport.get_backend(backend_id).describe_blob
    with pytest.raises(ValueError):
        describe(garbage)


def test_example_backend_describes_its_blob():
    from edgeport_example import ExamplePartitioner

    class AddMul(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x + 1.0) * x

    ep = torch.export.export(AddMul(), (torch.randn(3, 4),))
    pte = to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()]).to_executorch().buffer
    (delegate,) = inspect_program(pte)["methods"][0]["delegates"]
    desc = delegate["description"]
    assert desc["target"] == "numpy" and desc["producer_version"] and desc["nodes"] == sum(desc["ops"].values())
    assert desc["inputs"] and all(i == {"dtype": "float32", "shape": [3, 4]} for i in desc["inputs"])


def test_text_summarizes_long_key_lists_and_json_keeps_them_all():
    """A CNN's delegate has a named-data key per weight (SHA-256 names): the text gives the count and a few
    shortened names on one line; --json keeps every key."""
    info = inspect_program(_edgeport(cnn_bn_pool, "xnnpack"))
    keys = info["methods"][0]["delegates"][0]["description"]["named_data_keys"]
    assert len(keys) >= 5 and all(len(k) == 64 for k in keys)
    line = next(x for x in format_inspection(info).splitlines() if "named_data_keys" in x)
    assert f"{len(keys)} entries" in line and "--json" in line and keys[-1] not in line and len(line) < 160


def test_lower_with_quantize_names_the_extra_when_torchao_is_missing(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ModuleNotFoundError("No module named 'torchao'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    model, example = two_linear()
    with pytest.raises(ImportError, match=r"pip install 'edgeport\[quantize\]'"):
        edgeport.lower(model, example, quantize=True)
