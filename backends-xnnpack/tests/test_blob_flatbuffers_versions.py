"""XNNPACK blobs written with every Python ``flatbuffers`` release from 24.x to the newest read back and run.

The blob reader follows the flatbuffers format as flatbuffers' own verifier checks it (ExecuTorch's XNNPACK runtime
verifies every blob): each field inside the buffer and aligned to its size, tables and vector lengths 4-aligned,
and the vtable's table-size entry ignored (releases before 25.12 share a vtable between tables of different sizes,
so it can be smaller than the table). One torch-free child interpreter per release writes the blob (its directory,
filled by ``scripts/install.sh``, first on ``PYTHONPATH``); the parent reads it, compares the graph with the one
written, and runs it against a numpy reference. Programs with such blobs on the stock runtime:
``core/tests/program/test_flatbuffers_versions.py``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeport_xnnpack import native
from edgeport_xnnpack.runtime import XnnpackExecutor
from edgeport_xnnpack.schema import ConstantDataOffset, Graph, TensorValue, XNode, read_blob, serialize
from edgeport_xnnpack.schema import reader as blob_reader
from edgeport_xnnpack.schema.reader import BlobError, split_blob
from edgeport_xnnpack.schema.writer import HEADER

REPO = Path(__file__).resolve().parents[2]
VERSIONS_DIR = REPO / ".venv" / "flatbuffers-versions"
# every release from the oldest 24.x to the newest, side by side, and "venv" (the venv's own: 25.2.10 while
# tosa-tools pins it); a child takes well under a second
OLDER = ["24.3.6", "24.3.7", "24.3.25", "24.12.23", "25.1.21", "25.1.24", "25.2.10", "25.9.23"]
NEWEST = "25.12.19"  # the first release whose builder no longer shares a vtable between tables of different sizes

_CHILD = r"""
import json, os, pickle, sys
want, out = sys.argv[1], sys.argv[2]
import flatbuffers
report = {"version": flatbuffers.__version__, "where": os.path.dirname(os.path.abspath(flatbuffers.__file__))}
if report["version"] == want:
    import edgeport_xnnpack.schema.writer as writer
    report["writer uses it"] = writer.flatbuffers is flatbuffers
    with open(os.path.join(out, "graph.pkl"), "rb") as f:
        graph, data = pickle.load(f)
    with open(os.path.join(out, "blob.bin"), "wb") as f:
        f.write(writer.serialize(graph, data))
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f)
"""


def linear_relu_graph() -> tuple[Graph, bytes, np.ndarray, np.ndarray]:
    """y = relu(x @ w.T + b): x [2, 8] in, w [4, 8] and b [4] in the blob's constant data."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    g = Graph(constant_data=[ConstantDataOffset(), ConstantDataOffset(0, w.nbytes),
                             ConstantDataOffset(w.nbytes, b.nbytes)])
    g.values = [
        TensorValue(1, [2, 8], 0, external_id=0, flags=1),
        TensorValue(1, [4, 8], 1, constant_buffer_idx=1),
        TensorValue(1, [4], 2, constant_buffer_idx=2),
        TensorValue(1, [2, 4], 3, external_id=1, flags=2),
    ]
    g.nodes = [XNode("XNNFullyConnected", dict(input1_id=0, filter_id=1, bias_id=2, output_id=3, flags=0), 5,
                     (0.0, float("inf")))]
    g.num_externs, g.input_ids, g.output_ids = 2, [0], [3]
    return g, w.tobytes() + b.tobytes(), w, b


def fields_beyond_table_size(blob: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many fields the reader reads that end past the table size their vtable gives."""
    seen = []
    real = blob_reader._Table._off

    def off(table, slot: int, size: int = 1) -> int:
        voff = real(table, slot, size)
        if voff:
            tsize = struct.unpack_from("<H", table.buf.mv, table.vt + 2)[0]
            seen.append(voff + size > tsize)
        return voff

    with monkeypatch.context() as m:
        m.setattr(blob_reader._Table, "_off", off)
        read_blob(blob)
    return sum(seen)


@pytest.mark.parametrize("version", [*OLDER, NEWEST, "venv"])
def test_blob_written_with_each_flatbuffers_release(version, tmp_path, monkeypatch):
    env = dict(os.environ)
    if version == "venv":
        want, where = importlib.metadata.version("flatbuffers"), None
    else:
        want, where = version, VERSIONS_DIR / version
        if not (where / "flatbuffers" / "__init__.py").is_file():
            pytest.fail(f"flatbuffers {version} is not installed in {where}: run scripts/install.sh")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH")]))
    g, data, w, b = linear_relu_graph()
    (tmp_path / "graph.pkl").write_bytes(pickle.dumps((g, data)))
    proc = subprocess.run([sys.executable, "-c", _CHILD, want, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"flatbuffers {want}: child failed:\n{proc.stderr[-4000:]}"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["version"] == want, f"asked for flatbuffers {want}, the child imported {report['version']}"
    if where is not None:
        assert Path(report["where"]) == where / "flatbuffers", report["where"]
    else:
        assert VERSIONS_DIR not in Path(report["where"]).parents, report["where"]
    assert report["writer uses it"]

    blob = (tmp_path / "blob.bin").read_bytes()
    back, constants = read_blob(blob)
    assert back.nodes == g.nodes and back.values == g.values and back.constant_data == g.constant_data
    assert (back.num_externs, back.input_ids, back.output_ids) == (2, [0], [3])
    assert bytes(constants[:len(data)]) == data
    odd = fields_beyond_table_size(blob, monkeypatch)
    # the releases before 25.12 really write the layout in question (else this would prove nothing)
    assert (odd > 0) == (want in OLDER), f"flatbuffers {want}: {odd} fields beyond the vtable's table size"
    if not native.is_available()[0]:  # no libXNNPACK: the read-back above is all that can be checked
        return
    ex = XnnpackExecutor(num_threads=1)
    x = np.random.default_rng(1).standard_normal((2, 8), dtype=np.float32)
    (out,) = ex.execute(ex.init(memoryview(blob), []), [x])
    np.testing.assert_allclose(out, np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------- the rule, case by case


def _patch(blob: bytes, fb_start: int, *writes: tuple[str, int, int]) -> bytes:
    out = bytearray(blob)
    for fmt, at, value in writes:
        struct.pack_into(fmt, out, fb_start + at, value)
    return bytes(out)


def _constant_tables(blob: bytes) -> tuple[int, list[tuple[int, int]]]:
    """(flatbuffer start in the blob, [(position, vtable position)] of every ConstantDataOffset table)."""
    fb, _ = split_blob(blob)
    start = HEADER.unpack_from(blob, 0)[3]
    root = struct.unpack_from("<I", fb, 0)[0]
    table = lambda pos: (pos, pos - struct.unpack_from("<i", fb, pos)[0])  # noqa: E731
    _, root_vt = table(root)
    at = root + struct.unpack_from("<H", fb, root_vt + 4 + 2 * 8)[0]  # slot 8: constant_data
    vec = at + struct.unpack_from("<I", fb, at)[0]
    items = [vec + 4 + 4 * i for i in range(struct.unpack_from("<I", fb, vec)[0])]
    return start, [table(p + struct.unpack_from("<I", fb, p)[0]) for p in items]


def test_blob_reader_ignores_the_table_size_but_not_alignment_or_bounds():
    g, data, _, _ = linear_relu_graph()
    blob = serialize(g, data)
    start, constants = _constant_tables(blob)
    fb_len = len(split_blob(blob)[0])
    pos, vt = constants[2]  # ConstantDataOffset(128, 16): u64 offset (slot 0) and size
    (voff,) = struct.unpack_from("<H", blob, start + vt + 4)
    assert (start + pos + voff) % 8 == 0
    # the layout flatbuffers 24.x .. 25.9 writes: a vtable saying the table is smaller than its fields
    small = _patch(blob, start, ("<H", vt + 2, 4))
    assert read_blob(small)[0].constant_data == g.constant_data
    with pytest.raises(BlobError, match="not 8-byte aligned"):
        read_blob(_patch(blob, start, ("<H", vt + 4, voff + 4)))
    with pytest.raises(BlobError, match="lies outside the flatbuffer"):
        read_blob(_patch(blob, start, ("<H", vt + 4, (fb_len - pos + 7) // 8 * 8)))
    root = struct.unpack_from("<I", blob, start)[0]
    with pytest.raises(BlobError, match="XNNGraph: table at .* not 4-byte aligned"):
        read_blob(_patch(blob, start, ("<I", 0, root + 2)))
