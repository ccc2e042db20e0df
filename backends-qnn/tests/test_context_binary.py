"""Context binaries: sealed and raw round trips, a fresh process, and corrupted input (never a crash)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgeport_qnn.sdk import QnnError, QuantParams


def build_fc_relu(context):
    rng = np.random.default_rng(7)
    g = context.graph_builder("fc_relu")
    g.add_input("x", (2, 8), np.float32)
    g.add_static("w", rng.standard_normal((4, 8)).astype(np.float32))
    g.add_static("b", rng.standard_normal(4).astype(np.float32))
    g.add_output("y", (2, 4), np.float32)
    g.add_node("FullyConnected", "fc0", ["x", "w", "b"], [("h", (2, 4), np.float32)])
    g.add_node("Relu", "relu0", ["h"], ["y"])
    return g.finalize()


def build_quantized(context):
    q = QuantParams(0.1, 128)
    g = context.graph_builder("qadd")
    g.add_input("a", (1, 16), np.uint8, q)
    g.add_input("b", (1, 16), np.uint8, q)
    g.add_output("y", (1, 16), np.uint8, QuantParams(0.1, 128))
    g.add_node("ElementWiseAdd", "add0", ["a", "b"], ["y"])
    return g.finalize()


def test_sealed_round_trip_keeps_specs_and_outputs(backend, context):
    fc = build_fc_relu(context)
    qadd = build_quantized(context)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    a = np.arange(64, 80, dtype=np.uint8).reshape(1, 16)
    expected = fc.execute([x]), qadd.execute([a, a])
    blob = context.context_binary()
    assert blob.startswith(b"EPQNNCB\x00") and len(blob) > 1000
    with backend.load_context(blob) as loaded:
        assert set(loaded.graphs) == {"fc_relu", "qadd"}
        for built in (fc, qadd):  # QNN's own description reads back what we declared: layouts agree
            again = loaded.graph(built.name)
            assert again.inputs == built.inputs and again.outputs == built.outputs
        assert loaded.graph("qadd").inputs[0].quant == QuantParams(0.1, 128)
        np.testing.assert_array_equal(loaded.graph("fc_relu").execute([x])[0], expected[0][0])
        np.testing.assert_array_equal(loaded.graph("qadd").execute([a, a])[0], expected[1][0])
        assert loaded.context_binary() == blob  # a loaded context serializes to the bytes it came from
    raw = context.raw_context_binary()
    assert blob.endswith(raw)
    with backend.load_context(raw, raw=True) as loaded_raw:  # probed in a child first
        np.testing.assert_array_equal(loaded_raw.graph("fc_relu").execute([x])[0], expected[0][0])


def test_saved_binary_runs_in_a_fresh_process(context, tmp_path):
    graph = build_fc_relu(context)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    (expected,) = graph.execute([x])
    path = tmp_path / "model.qnnctx"
    path.write_bytes(context.context_binary())
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import numpy as np
        from edgeport_qnn.sdk import QnnBackend
        with QnnBackend.load("htp") as backend, backend.load_context(open({str(path)!r}, "rb").read()) as ctx:
            (y,) = ctx.graph("fc_relu").execute([np.load({str(tmp_path / "x.npy")!r})])
            np.save({str(tmp_path / "y.npy")!r}, y)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b""  # QNN's messages are captured, its load banner goes to stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


def test_corrupted_or_truncated_sealed_binary_raises(backend, context):
    build_fc_relu(context)
    blob = context.context_binary()
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10
    for bad in (bytes(flipped), blob[:-1], blob[: len(blob) // 2], blob[:60], blob + b"\0", b"EPQNNCB\x00" + bytes(100)):
        with pytest.raises(QnnError):
            backend.load_context(bad)
    with pytest.raises(QnnError, match="not an edgeport context binary"):
        backend.load_context(b"\x01" * 4096)
    with pytest.raises(ValueError, match="empty"):
        backend.load_context(b"")
    with pytest.raises(TypeError):
        backend.load_context("not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too short"):
        backend.load_context(b"\x01" * 10, raw=True, probe=False)
    with pytest.raises(ValueError, match="sealed"):
        backend.load_context(blob, raw=True)


#: Single-byte changes of one known QNN 2.51 binary that crash Qualcomm's parsers (found by fuzzing):
#: offset -> new byte; 202 segfaults the system library, 22071 contextCreateFromBinary, 35011 aborts it.
KNOWN_CRASHES = {202: 34, 22071: 4, 35011: 32}
KNOWN_CRASH_SOURCE_SHA256 = "2ea5061c61f8d99578328a8fc64aa725cb3a56b5335f3c8d2d2c7a6547acf16f"


BUILD_KNOWN_FC = textwrap.dedent("""
    import sys
    import numpy as np
    from edgeport_qnn.sdk import QnnBackend
    with QnnBackend.load("htp") as backend, backend.create_context() as context:
        g = context.graph_builder("fc")
        g.add_input("x", (1, 8), np.float32)
        g.add_static("W", np.ones((4, 8), np.float32))
        g.add_output("y", (1, 4), np.float32)
        g.add_node("FullyConnected", "fc0", ["x", "W"], ["y"])
        g.finalize()
        open(sys.argv[1], "wb").write(context.raw_context_binary())
""")


def build_known_fc(tmp_path):
    """The raw binary of a small graph built first thing in a fresh process (QNN's bytes depend on how many
    contexts the process made before)."""
    path = tmp_path / "fc.bin"
    done = subprocess.run([sys.executable, "-c", BUILD_KNOWN_FC, str(path)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return path.read_bytes()


def test_known_qnn_crashes_are_contained_by_the_probe(backend, tmp_path):
    raw = build_known_fc(tmp_path)
    if hashlib.sha256(raw).hexdigest() != KNOWN_CRASH_SOURCE_SHA256:
        pytest.skip("these crash offsets are for QAIRT 2.51's serialization of this graph")
    for offset, value in KNOWN_CRASHES.items():
        bad = bytearray(raw)
        bad[offset] = value
        path = tmp_path / f"crash{offset}.bin"
        path.write_bytes(bad)
        unguarded = textwrap.dedent(f"""
            from edgeport_qnn.sdk import QnnBackend, QnnError
            b = QnnBackend.load("htp")
            try:
                b.load_context(open({str(path)!r}, "rb").read(), raw=True, probe=False)
            except QnnError:
                pass
        """)
        done = subprocess.run([sys.executable, "-c", unguarded], capture_output=True, timeout=120)
        assert done.returncode < 0, f"offset {offset}: QNN no longer crashes ({done.returncode})"
        with pytest.raises(QnnError, match="crashed"):
            backend.load_context(bytes(bad), raw=True)


FUZZ_CHILD = textwrap.dedent("""
    import json, random, sys
    import numpy as np
    from edgeport_qnn.sdk import QnnBackend, QnnError
    raw = open(sys.argv[1], "rb").read()
    rng = random.Random(int(sys.argv[2]))
    outcomes = {}
    with QnnBackend.load("htp") as backend:
        sealed = None
        for i in range(int(sys.argv[3])):
            data = bytearray(raw)
            kind = rng.choice(["truncate", "flip", "header", "zeros", "random", "splice"])
            if kind == "truncate":
                data = data[: rng.randrange(len(data))]
            elif kind == "flip":
                for _ in range(rng.choice([1, 8, 64])):
                    j = rng.randrange(len(data)); data[j] ^= 1 << rng.randrange(8)
            elif kind == "header":
                for _ in range(rng.choice([1, 3])):
                    data[rng.randrange(1024)] = rng.randrange(256)
            elif kind == "zeros":
                j = rng.randrange(len(data)); n = rng.randrange(1, 4096); data[j:j + n] = bytes(len(data[j:j + n]))
            elif kind == "random":
                data = bytearray(rng.randbytes(len(data)))
            else:
                j = rng.randrange(len(data)); del data[j:j + rng.randrange(1, 64)]
            try:
                with backend.load_context(bytes(data), raw=True) as ctx:
                    for g in ctx.graphs.values():
                        g.execute([np.zeros(s.shape, s.dtype) for s in g.inputs])
                result = "loaded"
            except QnnError as exc:
                result = "QnnError:" + ("crash" if "crashed" in str(exc) else str(exc.name))
            except ValueError:
                result = "ValueError"
            outcomes[result] = outcomes.get(result, 0) + 1
    print(json.dumps(outcomes))
""")


def test_fuzzed_raw_binaries_never_crash_the_process(backend, tmp_path):
    build_known_fc(tmp_path)
    path = tmp_path / "fc.bin"
    done = subprocess.run([sys.executable, "-c", FUZZ_CHILD, str(path), "4", "24"], capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    outcomes = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert sum(outcomes.values()) == 24
    assert set(outcomes) <= {"loaded", "ValueError"} | {k for k in outcomes if k.startswith("QnnError:")}
    assert any(k.startswith("QnnError:") for k in outcomes)
