"""``edgeport coreml extract``: the plugin subcommand, through ``edgeport.cli.main`` and the installed console
script, on edgeport's programs and on ExecuTorch 1.5.1's (its ``CoreMLPartitioner`` is the oracle); damaged
blobs and non-programs fail with exit status 2 and the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from coreml_models import build, lowered, patched_program

from edgeport import cli
from edgeport_coreml.schema.flat_directory import read_flat_directory


def _same_tree(root: Path, blob: bytes) -> None:
    flat = read_flat_directory(blob)
    written = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert written == set(flat.files)
    for rel, data in flat.files.items():
        assert (root / rel).read_bytes() == bytes(data)


def test_extract_edgeport_program(tmp_path, capsys):
    low = lowered("mlp")
    path = tmp_path / "mlp.pte"
    path.write_bytes(low.program)
    assert cli.main(["coreml", "extract", str(path), "-o", str(tmp_path / "out")]) == 0
    root = tmp_path / "out" / "forward_0" / "lowered_module"
    assert f"forward delegate 0: {root}" in capsys.readouterr().out
    _same_tree(root, low.blob())
    import coremltools as ct

    spec = ct.models.MLModel(str(root / "model.mlpackage"), skip_model_load=True).get_spec()
    assert list(spec.description.input[0].type.multiArrayType.shape) == list(low.example.shape)


@pytest.mark.executorch
def test_extract_executorch_program(tmp_path, capsys):
    pytest.importorskip("executorch.backends.apple.coreml.partition")
    import coremltools as ct
    import torch
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model, x = build("mlp")
    specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT32,
                                                 minimum_deployment_target=ct.target.iOS16)
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       partitioner=[CoreMLPartitioner(compile_specs=specs)])
    blob = bytes(edge.exported_program().graph_module.lowered_module_0.processed_bytes)
    path = tmp_path / "et.pte"
    path.write_bytes(edge.to_executorch().buffer)
    assert cli.main(["coreml", "extract", str(path), "-o", str(tmp_path / "out")]) == 0
    assert "forward delegate 0:" in capsys.readouterr().out
    root = tmp_path / "out" / "forward_0" / "lowered_module"
    _same_tree(root, blob)
    from executorch.backends.apple.coreml import executorchcoreml

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    assert executorchcoreml.unflatten_directory_contents(blob, str(theirs))
    assert sorted(str(p.relative_to(theirs / "lowered_module")) for p in (theirs / "lowered_module").rglob("*")) \
        == sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_extract_refuses_corrupted_blob_and_non_programs(tmp_path, capsys):
    low = lowered("mlp")
    bad = tmp_path / "bad.pte"
    bad.write_bytes(patched_program(low.program, low.blob()))
    assert cli.main(["coreml", "extract", str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "edgeport coreml extract: error:" in err and "delegate 0: not a valid CoreMLBackend blob" in err
    assert not (tmp_path / "out").exists()
    text = tmp_path / "notes.txt"
    text.write_text("not a program at all, just some text that is long enough\n" * 4)
    assert cli.main(["coreml", "extract", str(text), "-o", str(tmp_path / "out")]) == 2
    assert "not a .pte program" in capsys.readouterr().err
    assert cli.main(["coreml", "extract", str(tmp_path / "missing.pte"), "-o", str(tmp_path / "out")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_console_script(tmp_path):
    exe = shutil.which("edgeport", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the edgeport console script is not installed beside this interpreter")
    path = tmp_path / "cnn.pte"
    low = lowered("cnn")
    path.write_bytes(low.program)
    done = subprocess.run([exe, "coreml", "extract", str(path), "-o", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _same_tree(tmp_path / "out" / "forward_0" / "lowered_module", low.blob())
    failed = subprocess.run([exe, "coreml", "extract", str(tmp_path / "missing.pte"), "-o", str(tmp_path / "o2")],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "edgeport coreml extract: error:" in failed.stderr
