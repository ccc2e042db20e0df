"""Bad input to the Arm backends: damaged or foreign TOSA graphs are refused before the reference model sees
them (fuzzed in a child process, so a crash fails the test instead of killing the run), wrong inputs and wrong
compile specs get clear errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_arm import EthosUCompileSpec, TosaCompileSpec
from edgeport_arm.preprocess.graph import DType, TosaGraph
from edgeport_arm.runtime import TosaReferenceExecutor
from edgeport_arm.schema.tosa_reader import read_tosa


def _clamp_graph(minor: int = 0) -> bytes:
    g = TosaGraph(1, minor)
    x = g.input("x", [2, 3], DType.FP32)
    g.output(g.clamp(x, [2, 3], DType.FP32, -0.5, 0.5), [2, 3], DType.FP32)
    return g.serialize()


def test_good_graph_runs():
    ex = TosaReferenceExecutor()
    h = ex.init(memoryview(_clamp_graph()), [])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ex.execute(h, [x])[0], np.clip(x, -0.5, 0.5))


def test_wrong_inputs_are_refused():
    ex = TosaReferenceExecutor()
    h = ex.init(memoryview(_clamp_graph()), [])
    with pytest.raises(RuntimeExecutionError, match=r"input 0 must be float32 of shape \[2, 3\], got int8"):
        ex.execute(h, [np.zeros((2, 3), np.int8)])
    with pytest.raises(RuntimeExecutionError, match="1 inputs given, the graph takes 1|2 inputs given"):
        ex.execute(h, [np.zeros((2, 3), np.float32)] * 2)


def test_other_tosa_version_and_other_formats_are_refused():
    with pytest.raises(ProgramError, match="TOSA 1.1"):
        read_tosa(_clamp_graph(minor=1))
    with pytest.raises(ProgramError, match="not a TOSA flatbuffer"):
        read_tosa(b"\x10\x00\x00\x00XN01" + bytes(64))  # an XNNPACK-style identifier
    with pytest.raises(ProgramError, match="too short"):
        read_tosa(b"")


def test_compile_specs_are_checked():
    with pytest.raises(ValueError, match="TOSA-1.0\\+INT"):
        TosaCompileSpec("TOSA-2.0+INT")
    with pytest.raises(ValueError, match="names no TOSA profile"):
        TosaCompileSpec("TOSA-1.0")
    with pytest.raises(ValueError, match="unknown Ethos-U target"):
        EthosUCompileSpec("ethos-u99-1")
    with pytest.raises(ValueError, match="unknown compile spec"):
        TosaCompileSpec.from_compile_specs([CompileSpec("bogus", b"1")])
    with pytest.raises(ValueError, match="belongs to EthosUBackend"):
        TosaCompileSpec.from_compile_specs(EthosUCompileSpec("ethos-u85-256").to_compile_specs()[:2])
    spec = EthosUCompileSpec("ethos-u65-512", extra_flags=["--optimise=Size"])
    assert EthosUCompileSpec.from_compile_specs(spec.to_compile_specs()) == spec


_FUZZ = textwrap.dedent("""
    import random, sys
    import numpy as np
    from edgeport.errors import ProgramError, RuntimeExecutionError
    from edgeport_arm.runtime import TosaReferenceExecutor
    blob = bytearray(open(sys.argv[1], "rb").read())
    rng = random.Random(int(sys.argv[2]))
    ex = TosaReferenceExecutor()
    outcomes = {"refused": 0, "ran": 0}
    cases = [bytes(blob[:n]) for n in range(0, len(blob), max(1, len(blob) // 60))]
    for _ in range(300):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    for case in cases:
        try:
            h = ex.init(memoryview(case), [])
            x = np.zeros(h.info.inputs[0].shape, np.float32)
            ex.execute(h, [x])
            outcomes["ran"] += 1
        except (ProgramError, RuntimeExecutionError):
            outcomes["refused"] += 1
    print(outcomes)
""")


def test_fuzzed_tosa_blobs_never_crash(tmp_path):
    path = tmp_path / "clamp.tosa"
    path.write_bytes(_clamp_graph())
    proc = subprocess.run([sys.executable, "-c", _FUZZ, str(path), "7"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-2000:]}"
    assert "refused" in proc.stdout and "'refused': 0" not in proc.stdout, proc.stdout


def test_docs_op_table_is_generated_from_the_capability_table():
    """docs/backends/arm.md lists exactly the capability table (`edgeport op-table TOSABackend --update`)."""
    from pathlib import Path

    from edgeport import scaffold
    from edgeport_arm.capabilities import capabilities

    doc = Path(__file__).resolve().parents[2] / "docs" / "backends" / "arm.md"
    text = doc.read_text(encoding="utf-8")
    assert scaffold.update_generated_block(text, "TOSABackend", capabilities()) == text, (
        f"{doc} is stale: run edgeport op-table TOSABackend --update {doc}")
