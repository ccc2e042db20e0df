"""edgeport's flattened-directory writer and reader (ExecuTorch's Core ML blob layout)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from edgeport_coreml.schema.flat_directory import (
    FlatDirectoryError,
    flatten_directory,
    flatten_tree,
    read_flat_directory,
    unflatten_to,
)

TREE = {"a.txt": b"hello", "sub": {"b.bin": b"WORLD!!", "empty": {}, "zero": b""}, "c": bytes(range(256))}


def _files(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_files(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


@pytest.mark.parametrize("alignment", [1, 8, 4096])
def test_round_trip(alignment):
    blob = flatten_tree("root", TREE, alignment)
    flat = read_flat_directory(blob)
    assert flat.root_name == "root"
    assert {k: bytes(v) for k, v in flat.files.items()} == _files(TREE)
    assert sorted(flat.directories) == ["", "sub", "sub/empty"]
    dest = tempfile.mkdtemp()
    root = unflatten_to(blob, dest)
    assert (root / "sub" / "empty").is_dir() and (root / "sub" / "zero").read_bytes() == b""
    assert flatten_directory(root, alignment) == blob


def test_metadata_is_reversed_compact_json():
    blob = flatten_tree("d", {"a.txt": b"hello"})
    assert blob[:5] == b"hello"
    meta = json.loads(blob[5:][::-1])
    assert meta == {"nodes": [{"children": {}, "dataRegion": {"offset": 0, "size": 5}, "kind": 0, "name": "a.txt"},
                              {"children": {"a.txt": 0}, "dataRegion": {"offset": 0, "size": 0}, "kind": 1,
                               "name": "d"}]}


@pytest.mark.executorch
def test_identical_to_executorch_flattening():
    executorchcoreml = pytest.importorskip("executorch.backends.apple.coreml.executorchcoreml")
    root = unflatten_to(flatten_tree("d", {"a.txt": b"hello", "sub": {"b.bin": b"WORLD!!"}}), tempfile.mkdtemp())
    theirs = executorchcoreml.flatten_directory_contents(str(root))
    assert {k: bytes(v) for k, v in read_flat_directory(theirs).files.items()} == {"a.txt": b"hello",
                                                                                   "sub/b.bin": b"WORLD!!"}
    # ExecuTorch orders entries by its hash map; with one entry per directory the bytes are the same
    single = unflatten_to(flatten_tree("x", {"only": {"f": b"123"}}), tempfile.mkdtemp())
    assert executorchcoreml.flatten_directory_contents(str(single)) == flatten_directory(single)
    dest = tempfile.mkdtemp()
    assert executorchcoreml.unflatten_directory_contents(flatten_tree("d", TREE), dest)
    assert sorted(os.listdir(os.path.join(dest, "d"))) == ["a.txt", "c", "sub"]


def _meta(nodes):
    return json.dumps({"nodes": nodes}, separators=(",", ":")).encode()[::-1]


@pytest.mark.parametrize("blob, match", [
    (b"", "empty blob"),
    (b"\x00" * 64, "does not end with reversed JSON"),
    (flatten_tree("d", TREE)[:-10], "does not end with reversed JSON|never closes|lists no nodes"),
    (b"}" + b"x" * 10 + b"{", "not JSON"),
    (b"abc" + b"}" * 1 + b"{", "lists no nodes"),
    (b"abc" + _meta([{"children": {}, "dataRegion": {"offset": 0, "size": 99}, "kind": 0, "name": "f"},
                     {"children": {"f": 0}, "kind": 1, "name": "d"}]), "outside the data area"),
    (_meta([{"children": {}, "dataRegion": {"offset": 0, "size": 0}, "kind": 0, "name": "../evil"},
            {"children": {"../evil": 0}, "kind": 1, "name": "d"}]), "invalid entry name"),
    (_meta([{"children": {"x": 1}, "kind": 1, "name": "d"}, {"children": {"d": 0}, "kind": 1, "name": "x"}]),
     "does not precede it"),
    (_meta([{"children": {}, "kind": 1, "name": "a"}, {"children": {}, "kind": 1, "name": "d"}]), "belong to no"),
    (_meta([{"children": {}, "kind": 7, "name": "d"}]), "unknown kind"),
    (b"\x01" * 100 + flatten_tree("d", {}), "not alignment padding"),
])
def test_damaged_blobs_are_refused(blob, match):
    with pytest.raises(FlatDirectoryError, match=match):
        read_flat_directory(blob)


def test_nothing_is_written_for_a_damaged_blob(tmp_path):
    with pytest.raises(FlatDirectoryError):
        unflatten_to(b"garbage{", tmp_path)
    assert list(tmp_path.iterdir()) == []
