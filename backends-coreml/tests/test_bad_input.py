"""Bad input: damaged Core ML blobs are refused by describe_blob, extract and the executor with clear errors."""

from __future__ import annotations

import pytest
from coreml_models import lowered, patched_program

from edgeport.errors import ProgramError
from edgeport_coreml.describe import describe_coreml_blob
from edgeport_coreml.extract import extract, main
from edgeport_coreml.runtime import CoreMLExecutor
from edgeport_coreml.schema.flat_directory import flatten_tree, read_flat_directory


def _corruptions(blob: bytes) -> dict[str, bytes]:
    tail = len(blob) - 40
    return {
        "truncated": blob[: len(blob) // 2],
        "metadata_flipped": blob[:tail] + bytes(b ^ 0x5A for b in blob[tail:]),
        "garbage": b"\x7fELF" + bytes(300),
        "xnnpack_like": b"\x10\x00\x00\x00XN01" + bytes(64),
        "empty": b"",
    }


@pytest.mark.parametrize("kind", ["truncated", "metadata_flipped", "garbage", "xnnpack_like", "empty"])
def test_describe_refuses_damaged_blobs(kind):
    blob = _corruptions(lowered("mlp").blob())[kind]
    with pytest.raises(ValueError, match="not a valid CoreMLBackend blob"):
        describe_coreml_blob(blob)


@pytest.mark.parametrize("kind", ["truncated", "metadata_flipped", "garbage"])
def test_executor_refuses_damaged_blobs(kind):
    blob = _corruptions(lowered("mlp").blob())[kind]
    with pytest.raises(ProgramError, match="CoreMLBackend: .*(damaged|not a flattened)"):
        CoreMLExecutor().init(memoryview(blob), [])


def test_blob_without_metadata_or_model():
    no_meta = flatten_tree("lowered_module", {"model.mlpackage": {"Manifest.json": b"{}"}})
    with pytest.raises(ValueError, match="no readable metadata.json"):
        describe_coreml_blob(no_meta)
    bad_spec = flatten_tree("lowered_module", {
        "metadata.json": b'{"inputNames": ["x"], "outputNames": ["y"], "identifier": "i"}',
        "model.mlpackage": {"Manifest.json": b'{"rootModelIdentifier": "A", "itemInfoEntries": {"A": {"path": '
                                             b'"com.apple.CoreML/model.mlmodel"}}}',
                            "Data": {"com.apple.CoreML": {"model.mlmodel": b"\xff\xfe not protobuf"}}}})
    with pytest.raises(ValueError, match="not a Core ML model"):
        describe_coreml_blob(bad_spec)


def test_extract_refuses_damaged_program(tmp_path, capsys):
    low = lowered("mlp")
    bad = patched_program(low.program, low.blob())
    with pytest.raises(ProgramError, match="delegate 0: not a valid CoreMLBackend blob"):
        extract(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    path = tmp_path / "bad.pte"
    path.write_bytes(bad)
    assert main([str(path), "-o", str(tmp_path / "out")]) == 2
    assert "not a valid CoreMLBackend blob" in capsys.readouterr().err


def test_extract_writes_the_model_directory(tmp_path, capsys):
    low = lowered("cnn")
    path = tmp_path / "cnn.pte"
    path.write_bytes(low.program)
    assert main([str(path), "-o", str(tmp_path / "out")]) == 0
    root = tmp_path / "out" / "forward_0" / "lowered_module"
    assert str(root) in capsys.readouterr().out
    assert (root / "model.mlpackage" / "Manifest.json").is_file() and (root / "metadata.json").is_file()
    flat = read_flat_directory(low.blob())
    for rel, data in flat.files.items():
        assert (root / rel).read_bytes() == bytes(data)


def test_extract_needs_a_core_ml_delegate(tmp_path):
    from edgeport_coreml.schema.flat_directory import FlatDirectoryError

    with pytest.raises((ProgramError, FlatDirectoryError, ValueError)):
        extract(b"not a program", tmp_path)
