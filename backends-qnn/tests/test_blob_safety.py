"""The executor refuses bad blobs at init with ProgramError (never a crash) and bad inputs at execute."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import edgeport
from edgeport.errors import EdgeportError, ProgramError, RuntimeExecutionError

pytestmark = pytest.mark.usefixtures("requires_qnn")


class _Add(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


@pytest.fixture(scope="module")
def blob(requires_qnn) -> bytes:
    from edgeport_qnn import QnnPartitioner

    ins = (torch.randn(2, 3), torch.randn(2, 3))
    program = edgeport.to_edge_transform_and_lower(torch.export.export(_Add(), ins), partitioner=[QnnPartitioner()])
    return bytes(program.exported_program().graph_module.lowered_module_0.processed_bytes)


@pytest.fixture
def executor():
    from edgeport_qnn.runtime import QnnExecutor

    return QnnExecutor()


def _rewrite_header(blob: bytes, **changes) -> bytes:
    import json
    import struct

    from edgeport_qnn.blob import _PREFIX

    magic, version, size = _PREFIX.unpack_from(blob)
    header = json.loads(blob[12:12 + size])
    header.update(changes)
    text = json.dumps(header).encode()
    return struct.pack("<4sII", magic, version, len(text)) + text + blob[12 + size:]


def test_good_blob_runs_and_is_freed(blob, executor):
    h = executor.init(memoryview(blob), [])
    x, y = np.ones((2, 3), np.float32), -2 * np.ones((2, 3), np.float32)
    (out,) = executor.execute(h, [x, np.arange(6, dtype=np.float32).reshape(2, 3)])
    np.testing.assert_array_equal(out, np.maximum(1 + np.arange(6, dtype=np.float32).reshape(2, 3), 0))
    (out,) = executor.execute(h, [x, y])
    assert (out == 0).all()
    executor.destroy(h)
    assert h.context.closed


@pytest.mark.parametrize("change, match", [
    ({"qnn_build": "v2.0.0.0"}, "built by QNN v2.0.0.0"),
    ({"qnn_core_api": "1.0.0"}, "lower the model again"),
    ({"soc_model": "SM8750"}, "lowered for SoC SM8750"),
    ({"inputs": [{"shape": [2, 4], "dtype": "float32"}]}, "does not match the blob header"),
    ({"inputs": "x"}, "non-empty list"),
    ({"graph": "other"}, "no graph 'other'"),
])
def test_foreign_header_rejected(blob, executor, change, match):
    with pytest.raises(ProgramError, match=match):
        executor.init(memoryview(_rewrite_header(blob, **change)), [])


def test_runtime_soc_option(blob, executor):
    from edgeport_qnn import QnnRuntimeOptions

    with pytest.raises(ProgramError, match="runs SM8550"):
        executor.init(memoryview(blob), [], runtime_options=QnnRuntimeOptions(soc_model="SM8550"))


@pytest.mark.parametrize("bad", [b"", b"EPQN", b"XXXX" + bytes(60)])
def test_garbage_rejected(executor, bad):
    with pytest.raises(ProgramError):
        executor.init(memoryview(bad), [])


def test_bad_inputs_rejected(blob, executor):
    h = executor.init(memoryview(blob), [])
    try:
        good = np.ones((2, 3), np.float32)
        for inputs in ([good], [good, good.astype(np.float64)], [good, np.ones((3, 2), np.float32)],
                       [good, good, good]):
            with pytest.raises(RuntimeExecutionError):
                executor.execute(h, inputs)
        (out,) = executor.execute(h, [good, np.asfortranarray(np.ones((2, 3), np.float32))[:, :]])
        assert out.shape == (2, 3)
    finally:
        executor.destroy(h)


def test_fuzzed_blobs_never_crash(blob, tmp_path: Path):
    """Mutated blobs (bit flips, truncation, splices) in a child process: each raises an EdgeportError at init."""
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    code = textwrap.dedent(f"""
        import random, sys
        from edgeport.errors import EdgeportError
        from edgeport_qnn.runtime import QnnExecutor
        blob = open({str(path)!r}, "rb").read()
        ex, rng, ok = QnnExecutor(), random.Random(7), 0
        for i in range(120):
            b = bytearray(blob)
            kind = i % 4
            if kind == 0:
                for _ in range(rng.randint(1, 8)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif kind == 1:
                b = b[:rng.randrange(len(b))]
            elif kind == 2:
                p = rng.randrange(12, len(b)); b[p:p + 16] = bytes(rng.randrange(256) for _ in range(16))
            else:
                p = rng.randrange(len(b) - 64); b[p:p + 64] = b"\\xff" * 64
            try:
                h = ex.init(memoryview(bytes(b)), [])
            except EdgeportError:
                ok += 1
            else:
                ex.destroy(h)  # a mutation that left the blob valid (e.g. in JSON whitespace)
        print("OK", ok)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"child died with {done.returncode}: {done.stderr[-2000:]}"
    assert int(done.stdout.split("OK")[-1]) >= 100


def test_program_with_corrupted_blob_fails_at_load(blob):
    del blob
    with pytest.raises(EdgeportError):
        edgeport.runtime.Runtime.get().load_program(b"not a program")


def test_soc_through_load_method_backend_options():
    from edgeport_qnn import QcomChipset, QnnPartitioner, generate_qnn_executorch_compiler_spec

    ins = (torch.randn(2, 3), torch.randn(2, 3))
    specs = generate_qnn_executorch_compiler_spec(soc_model=QcomChipset.SM8750)
    pte = edgeport.to_edge_transform_and_lower(torch.export.export(_Add(), ins),
                                               partitioner=[QnnPartitioner(specs)]).to_executorch()
    program = edgeport.runtime.Runtime.get().load_program(pte.buffer)
    with pytest.raises(ProgramError, match="lowered for SoC SM8750, this runtime runs SM8650"):
        program.load_method("forward")
    method = program.load_method("forward", backend_options={"QnnBackend": {"soc_model": "SM8750"}})
    (out,) = method.execute([x.numpy() for x in ins])
    np.testing.assert_allclose(out, torch.relu(ins[0] + ins[1]).numpy(), rtol=1e-6)
