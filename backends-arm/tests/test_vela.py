"""Vela in-process (edgeport_arm.vela) and the vela_bin_stream format (edgeport_arm.schema.vela_stream).

Real Vela 5.2.0 compilations of small TOSA 1.0 graphs built with tosa_serializer; ExecuTorch's own
``vela_compile`` is the wire-compatibility oracle (test-only).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_SRC = Path(__file__).resolve().parents[1] / "src"
if importlib.util.find_spec("edgeport_arm") is None:  # not installed yet: use the source tree
    sys.path.insert(0, str(_SRC))

ts = pytest.importorskip("tosa_serializer")
pytest.importorskip("ethosu.vela")

from edgeport_arm.schema.vela_stream import (  # noqa: E402
    VelaIO,
    VelaStream,
    VelaStreamError,
    from_vela_npz,
    pack_vela_stream,
    parse_vela_stream,
)
from edgeport_arm.vela import (  # noqa: E402
    ACCELERATORS,
    VelaError,
    compile_tosa,
    default_system_config,
    vela_version,
)

TARGETS = ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256")
HEADER = struct.Struct("<16sIB11s")


# ----------------------------------------------------------------------------- TOSA graphs


def _graph() -> ts.TosaSerializer:
    return ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)


def conv_graph(dtype: str = "int8", seed: int = 0) -> bytes:
    """3x3 conv, 4 -> 8 channels on 1x8x8x4 (int8: plus a per-channel RESCALE to int8)."""
    rng = np.random.default_rng(seed)
    g = _graph()
    if dtype == "fp32":
        g.addInputTensor(ts.TosaSerializerTensor("x", [1, 8, 8, 4], ts.DType.FP32, data=None))
        g.addConst([8, 3, 3, 4], ts.DType.FP32, rng.random((8, 3, 3, 4), np.float32), name="w")
        g.addConst([8], ts.DType.FP32, np.zeros(8, np.float32), name="b")
        g.addConst([1], ts.DType.FP32, np.zeros(1, np.float32), name="izp")
        g.addConst([1], ts.DType.FP32, np.zeros(1, np.float32), name="wzp")
        out = g.addIntermediate([1, 8, 8, 8], ts.DType.FP32)
        a = ts.TosaSerializerAttribute()
        a.Conv2dAttribute(pad=[1, 1, 1, 1], stride=[1, 1], dilation=[1, 1], local_bound=False, acc_type=ts.DType.FP32)
        g.addOperator(ts.Op.CONV2D, ["x", "w", "b", "izp", "wzp"], [out.name], a)
        g.addOutputTensor(out)
        return g.serialize()
    g.addInputTensor(ts.TosaSerializerTensor("x", [1, 8, 8, 4], ts.DType.INT8, data=None))
    g.addConst([8, 3, 3, 4], ts.DType.INT8, rng.integers(-127, 127, (8, 3, 3, 4)).astype(np.int8), name="w")
    g.addConst([8], ts.DType.INT32, np.zeros(8, np.int32), name="b")
    g.addConst([1], ts.DType.INT8, np.array([5], np.int8), name="izp")
    g.addConst([1], ts.DType.INT8, np.array([0], np.int8), name="wzp")
    acc = g.addIntermediate([1, 8, 8, 8], ts.DType.INT32)
    a = ts.TosaSerializerAttribute()
    a.Conv2dAttribute(pad=[1, 1, 1, 1], stride=[1, 1], dilation=[1, 1], local_bound=False, acc_type=ts.DType.INT32)
    g.addOperator(ts.Op.CONV2D, ["x", "w", "b", "izp", "wzp"], [acc.name], a)
    g.addConst([8], ts.DType.INT32, np.full(8, 1 << 30, np.int32), name="m")
    g.addConst([8], ts.DType.INT8, np.full(8, 38, np.int8), name="s")
    g.addConst([1], ts.DType.INT32, np.array([0], np.int32), name="i2")
    g.addConst([1], ts.DType.INT8, np.array([-3], np.int8), name="o2")
    out = g.addIntermediate([1, 8, 8, 8], ts.DType.INT8)
    a = ts.TosaSerializerAttribute()
    a.RescaleAttribute(scale32=True, rounding_mode=ts.RoundingMode.DOUBLE_ROUND, per_channel=True,
                       input_unsigned=False, output_unsigned=False)
    g.addOperator(ts.Op.RESCALE, [acc.name, "m", "s", "i2", "o2"], [out.name], a)
    g.addOutputTensor(out)
    return g.serialize()


def bitwise_and_graph() -> bytes:
    """int32 BITWISE_AND: the U85 runs it, the U55 cannot."""
    g = _graph()
    for name in ("x", "y"):
        g.addInputTensor(ts.TosaSerializerTensor(name, [1, 8, 8, 4], ts.DType.INT32, data=None))
    out = g.addIntermediate([1, 8, 8, 4], ts.DType.INT32)
    a = ts.TosaSerializerAttribute()
    a.BitwiseAndAttribute()
    g.addOperator(ts.Op.BITWISE_AND, ["x", "y"], [out.name], a)
    g.addOutputTensor(out)
    return g.serialize()


@pytest.fixture(scope="module")
def int8_blob() -> bytes:
    return conv_graph("int8")


@pytest.fixture(scope="module")
def compiled(int8_blob):
    return {t: compile_tosa(int8_blob, target=t, partition_name="conv") for t in TARGETS}


def _vela_flags(target: str) -> list[str]:
    sc, mm = default_system_config(target)
    return [f"--accelerator-config={target}", "--config=Arm/vela.ini", "--output-format=raw",
            f"--system-config={sc}", f"--memory-mode={mm}"]


# ----------------------------------------------------------------------------- compile_tosa


def test_targets_and_defaults():
    assert len(ACCELERATORS) == 11
    assert default_system_config("ethos-u55-32") == ("Ethos_U55_High_End_Embedded", "Shared_Sram")
    assert default_system_config("ethos-u65-512") == ("Ethos_U65_High_End", "Dedicated_Sram_384KB")
    assert default_system_config("ethos-u85-2048") == ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only")
    from ethosu.vela.architecture_features import Accelerator

    assert set(ACCELERATORS) == set(Accelerator.member_list())
    for bad in ("ethos-u55-512", "ethos-u99-128", "", "cortex-m55"):
        with pytest.raises(ValueError, match="unknown Ethos-U target"):
            default_system_config(bad)
        with pytest.raises(ValueError, match="unknown Ethos-U target"):
            compile_tosa(conv_graph(), target=bad)


@pytest.mark.parametrize("target", TARGETS)
def test_compile_int8_conv(target, compiled, int8_blob, tmp_path):
    res = compiled[target]
    stream = res.stream
    assert res.blob == pack_vela_stream(stream)
    assert parse_vela_stream(res.blob) == stream
    assert parse_vela_stream(memoryview(bytearray(res.blob))) == stream
    assert stream.external == {}
    assert len(stream.cmd_data) > 0 and len(stream.weight_data) > 0 and stream.scratch_size > 0
    # Vela pads the NHWC shapes to 6-D
    assert [io.shape for io in stream.inputs] == [(1, 1, 1, 8, 8, 4)]
    assert [io.shape for io in stream.outputs] == [(1, 1, 1, 8, 8, 8)]
    assert all(io.elem_size == 1 for io in (*stream.inputs, *stream.outputs))

    # the same compilation run by hand: from_vela_npz agrees with the parsed blob
    from ethosu.vela import vela

    (tmp_path / "m.tosa").write_bytes(int8_blob)
    with contextlib.redirect_stdout(io.StringIO()):
        assert vela.main([*_vela_flags(target), f"--output-dir={tmp_path / 'out'}", str(tmp_path / "m.tosa")]) == 0
    assert from_vela_npz(tmp_path / "out" / "m_vela.npz") == stream

    est = res.estimates
    sc, mm = default_system_config(target)
    assert (est.system_config, est.memory_mode) == (sc, mm)
    assert est.accelerator == target.replace("ethos-u", "Ethos_U").replace("-", "_")
    assert est.cycles_npu > 0 and est.cycles_total >= est.cycles_npu and est.inference_time_s > 0
    assert est.macs == 8 * 8 * 8 * 3 * 3 * 4
    assert est.npu_ops == 1 and est.cpu_ops == 0  # conv + rescale fused into one NPU operation
    assert est.original_weight_bytes == 8 * 3 * 3 * 4 and est.encoded_weight_bytes > 0
    assert est.sram_used_kib + est.dram_used_kib > 0
    assert est.per_layer == ()
    assert json.loads(json.dumps(est.to_dict()))["npu_ops"] == 1
    assert "NPU operators = 1" in res.log


def test_estimates_differ_between_targets(compiled):
    u55, u85 = compiled["ethos-u55-128"].estimates, compiled["ethos-u85-256"].estimates
    assert u55.cycles_total != u85.cycles_total
    assert compiled["ethos-u55-128"].stream.cmd_data != compiled["ethos-u85-256"].stream.cmd_data


def test_float_graph_is_refused():
    # Vela 5.2.0 does not place float operators on the CPU: its TOSA validator rejects the graph
    for target in ("ethos-u55-128", "ethos-u85-256"):
        with pytest.raises(VelaError, match="Input data type not supported") as info:
            compile_tosa(conv_graph("fp32"), target=target, partition_name="float_part")
        assert "'float_part'" in str(info.value) and target in str(info.value)
        assert "Traceback" not in str(info.value)


def test_operator_the_npu_cannot_run():
    with pytest.raises(VelaError, match=r"partition 'ands' for ethos-u55-128: .*could not run on NPU"):
        compile_tosa(bitwise_and_graph(), target="ethos-u55-128", partition_name="ands")
    res = compile_tosa(bitwise_and_graph(), target="ethos-u85-256")
    assert res.estimates.npu_ops == 1 and res.estimates.cpu_ops == 0
    assert len(res.stream.inputs) == 2 and all(io.elem_size == 4 for io in res.stream.inputs)


def test_bad_input_refused_before_vela(int8_blob):
    for blob, match in [
        (b"", "empty"),
        (b"\0" * 64, "not a TOSA flatbuffer"),
        (bytes(random.Random(1).randrange(256) for _ in range(500)), "not a TOSA flatbuffer"),
        (b"\x08\0\0\0TFL3" + bytes(40), "not a TOSA flatbuffer"),
        (b"\xff\xff\0\0TOSA" + bytes(40), "root offset"),
    ]:
        with pytest.raises(VelaError, match=match) as info:
            compile_tosa(blob, target="ethos-u55-128", partition_name="p7")
        assert "'p7'" in str(info.value) and "ethos-u55-128" in str(info.value)
    with pytest.raises(VelaError, match="must be bytes"):
        compile_tosa("TOSA", target="ethos-u55-128")  # type: ignore[arg-type]
    # a truncated TOSA file gets through the cheap check and is refused by Vela's reader, reported as VelaError
    with pytest.raises(VelaError, match="partition 'cut' for ethos-u85-256: .*TOSA FB Reader error"):
        compile_tosa(int8_blob[: len(int8_blob) // 2], target="ethos-u85-256", partition_name="cut")


def test_vela_option_errors(int8_blob):
    with pytest.raises(VelaError, match="Section System_Config.Nope not found"):
        compile_tosa(int8_blob, target="ethos-u55-128", system_config="Nope")
    with pytest.raises(VelaError, match="Memory_Mode.Nope") as info:
        compile_tosa(int8_blob, target="ethos-u65-256", memory_mode="Nope", partition_name="q")
    assert "'q'" in str(info.value) and "ethos-u65-256" in str(info.value)
    with pytest.raises(VelaError, match="exit status 2") as info:
        compile_tosa(int8_blob, target="ethos-u55-128", extra_flags=["--bogus"])
    assert "unrecognized arguments: --bogus" in str(info.value) and "usage" not in str(info.value)
    with pytest.raises(VelaError, match="wrote no command stream"):
        compile_tosa(int8_blob, target="ethos-u55-128", extra_flags=["--version"])
    with pytest.raises(ValueError, match="--system-config"):
        compile_tosa(int8_blob, target="ethos-u55-128", extra_flags=["--system-config=X"])
    with pytest.raises(ValueError, match="--output-dir"):
        compile_tosa(int8_blob, target="ethos-u55-128", extra_flags=["--output-dir", "/tmp"])
    with pytest.raises(TypeError):
        compile_tosa(int8_blob, target="ethos-u55-128", extra_flags="--verbose-all")  # type: ignore[arg-type]
    # ExecuTorch-style flags with spaces are split like ExecuTorch does
    res = compile_tosa(int8_blob, target="ethos-u55-128", extra_flags=["--optimise Size"])
    assert res.estimates.npu_ops == 1


def test_output_is_captured_including_native(int8_blob, capfd):
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 1234)
    try:
        res = compile_tosa(int8_blob, target="ethos-u85-256", extra_flags=["--verbose-all"])
        assert sys.getrecursionlimit() == limit + 1234  # Vela's setrecursionlimit is undone
    finally:
        sys.setrecursionlimit(limit)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert "NPU_OP_CONV" in res.log  # written by Vela's C++ core straight to file descriptor 1
    assert "NPU operators = 1" in res.log  # printed from Python
    rows = res.estimates.per_layer  # --verbose-performance (part of --verbose-all) writes <name>_per-layer.csv
    assert len(rows) == res.estimates.npu_ops
    assert rows[0]["Target"] == "NPU" and rows[0]["MAC Count"] == res.estimates.macs
    json.dumps(res.estimates.to_dict())


def test_version_and_cheap_import():
    from ethosu.vela._version import __version__

    assert vela_version() == __version__
    code = "import sys, edgeport_arm.vela, edgeport_arm.schema.vela_stream; print('ethosu' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.executorch
@pytest.mark.parametrize("target", TARGETS)
def test_executorch_vela_compile_is_byte_identical(target, compiled, int8_blob):
    arm_vela = pytest.importorskip("executorch.backends.arm.arm_vela")
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = arm_vela.vela_compile(int8_blob, _vela_flags(target))
    assert theirs.processed_bytes == compiled[target].blob
    if target != "ethos-u85-256":
        return
    # command and weight data in named data: ExecuTorch's key-carrying blocks parse to our external form
    with contextlib.redirect_stdout(io.StringIO()):
        ext = arm_vela.vela_compile(int8_blob, _vela_flags(target),
                                    block_placements={"cmd_data": "cmds", "weight_data": "weights"})
    parsed = parse_vela_stream(ext.processed_bytes)
    ours = compiled[target].stream
    keys = {b.payload: b.key for b in ext.external_blocks}
    assert parsed.external == {"cmd_data": keys[ours.cmd_data], "weight_data": keys[ours.weight_data]}
    assert parsed.cmd_data == b"" and parsed.inputs == ours.inputs and parsed.scratch_size == ours.scratch_size
    assert pack_vela_stream(parsed) == ext.processed_bytes


# ----------------------------------------------------------------------------- the stream format


def _sample() -> VelaStream:
    return VelaStream(
        cmd_data=b"COP1" + bytes(range(21)),
        weight_data=b"\x01" * 16,
        scratch_size=768,
        inputs=(VelaIO((1, 1, 1, 8, 8, 4), 1, 512, 1), VelaIO((1, 1, 1, 1, 1, 3), 2, -1, 2)),
        outputs=(VelaIO((1, 1, 1, 8, 8, 8), 1, 0, 1),),
    )


def _block(name: bytes, data: bytes, flag: int = 0, reserved: bytes = bytes(11), length: int | None = None) -> bytes:
    n = len(data) if length is None else length
    return HEADER.pack(name, n, flag, reserved) + data + bytes(-len(data) % 16)


def _ios(*rows: tuple[int, ...]) -> bytes:
    return struct.pack("<i", len(rows)) + b"".join(struct.pack("<9i", *r) for r in rows)


def _valid_blocks() -> list[tuple[bytes, bytes]]:
    return [
        (b"vela_bin_stream", b""), (b"cmd_data", b"abc"), (b"weight_data", b"w" * 20),
        (b"scratch_size", struct.pack("<I", 64)), (b"inputs", _ios((1, 1, 1, 2, 2, 1, 1, 0, 1))),
        (b"outputs", _ios()), (b"vela_end_stream", b""),
    ]


def _join(blocks) -> bytes:
    return b"".join(_block(*b) for b in blocks)


def test_pack_layout():
    blob = pack_vela_stream(_sample())
    assert blob[:32] == b"vela_bin_stream\0" + bytes(16)
    name, length, flag, reserved = HEADER.unpack_from(blob, 32)
    assert (name, length, flag, reserved) == (b"cmd_data".ljust(16, b"\0"), 25, 0, bytes(11))
    assert blob[64:89] == _sample().cmd_data and blob[89:96] == bytes(7)
    assert len(blob) % 16 == 0 and blob[-32:] == b"vela_end_stream\0" + bytes(16)
    # built by hand from the format description
    by_hand = _join([
        (b"vela_bin_stream", b""), (b"cmd_data", _sample().cmd_data), (b"weight_data", _sample().weight_data),
        (b"scratch_size", struct.pack("<I", 768)),
        (b"inputs", _ios((1, 1, 1, 8, 8, 4, 1, 512, 1), (1, 1, 1, 1, 1, 3, 2, -1, 2))),
        (b"outputs", _ios((1, 1, 1, 8, 8, 8, 1, 0, 1))), (b"vela_end_stream", b""),
    ])
    assert blob == by_hand and parse_vela_stream(by_hand) == _sample()
    assert parse_vela_stream(memoryview(blob + blob)[: len(blob)]) == _sample()
    strided = np.frombuffer(bytes(x for b in blob for x in (b, 0)), np.uint8)[::2]
    assert parse_vela_stream(memoryview(strided)) == _sample()


def test_external_blocks():
    key = "ab" * 32
    s = VelaStream(b"", b"", 16, (), (), external={"cmd_data": key})
    blob = pack_vela_stream(s)
    _, length, flag, _ = HEADER.unpack_from(blob, 32)
    assert (length, flag) == (64, 1) and blob[64:128] == key.encode()
    assert parse_vela_stream(blob) == s
    with pytest.raises(VelaStreamError, match="is not empty"):
        VelaStream(b"x", b"", 16, (), (), external={"cmd_data": key})
    with pytest.raises(VelaStreamError, match="cannot be stored externally"):
        VelaStream(b"", b"", 16, (), (), external={"inputs": key})
    with pytest.raises(VelaStreamError, match="printable ASCII"):
        VelaStream(b"", b"", 16, (), (), external={"weight_data": "clé"})
    blocks = _valid_blocks()
    for i, flag, payload, match in [
        (2, 1, "käse".encode(), "not printable ASCII"),
        (2, 1, b"", "empty or not printable"),
        (3, 1, b"k" * 4, "only cmd_data, weight_data may be external"),
        (1, 2, b"abc", "external flag is 2"),
    ]:
        bad = [_block(*b) for b in blocks]
        bad[i] = _block(blocks[i][0], payload, flag)
        with pytest.raises(VelaStreamError, match=match):
            parse_vela_stream(b"".join(bad))


def test_value_validation():
    with pytest.raises(VelaStreamError, match="6 dims"):
        VelaIO((1, 8, 8, 4), 1, 0, 1)
    with pytest.raises(VelaStreamError, match="int32"):
        VelaIO((1, 1, 1, 1, 1, 1 << 31), 1, 0, 1)
    with pytest.raises(VelaStreamError, match="must be an int"):
        VelaIO((1, 1, 1, 1, 1, 1), 1.0, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(VelaStreamError, match="scratch_size"):
        VelaStream(b"", b"", -1, (), ())
    assert VelaIO(np.array([1, 1, 1, 2, 2, 1]), np.int64(1), 0, 1).shape == (1, 1, 1, 2, 2, 1)
    with pytest.raises(TypeError):
        pack_vela_stream(b"not a stream")  # type: ignore[arg-type]


def _with(i: int, block: bytes) -> bytes:
    parts = [_block(*b) for b in _valid_blocks()]
    parts[i] = block
    return b"".join(parts)


@pytest.mark.parametrize("blob, match", [
    (b"", "empty"),
    (b"vela_bin_stream\0" + bytes(10), "truncated at the start"),
    (_join(_valid_blocks()[:3]), "truncated after block 'weight_data'"),
    (_with(1, HEADER.pack(b"c" * 16, 0, 0, bytes(11))), "not NUL-terminated"),
    (_with(1, _block(b"cmd_data\0x", b"abc")), "non-zero bytes after its NUL"),
    (_with(1, _block(b"\xffbad", b"abc")), "not UTF-8"),
    (_with(1, _block(b"cmd_dota", b"abc")), "block 'cmd_dota' at byte 32: unknown block name"),
    (_with(2, _block(b"cmd_data", b"abc")), "block 'cmd_data' at byte 80: duplicated block"),
    (_join(_valid_blocks()[1:]), "must start with 'vela_bin_stream'"),
    (_join(_valid_blocks()[:5] + _valid_blocks()[6:]), "without block\\(s\\) outputs"),
    (_with(1, _block(b"cmd_data", b"abc", reserved=b"\1" + bytes(10))), "reserved header bytes are not zero"),
    (_with(1, _block(b"cmd_data", b"abc", length=1 << 20)), "runs past the end"),
    (_with(1, HEADER.pack(b"cmd_data", 3, 0, bytes(11)) + b"abc" + b"\0" * 12 + b"\1"), "padding .* not zero"),
    (_with(0, _block(b"vela_bin_stream", b"x")), "marker block must be empty"),
    (_with(3, _block(b"scratch_size", b"\0" * 8)), "4-byte uint32, has 8"),
    (_with(4, _block(b"inputs", b"\1\0")), "cannot hold the int32 tensor count"),
    (_with(4, _block(b"inputs", struct.pack("<i", -1))), "negative tensor count"),
    (_with(4, _block(b"inputs", struct.pack("<i", 1 << 30))), "need 38654705668 data bytes, the block has 4"),
    (_join(_valid_blocks()) + bytes(16), "16 unexpected bytes after 'vela_end_stream'"),
])
def test_malformed_streams(blob, match):
    with pytest.raises(VelaStreamError, match=match) as info:
        parse_vela_stream(blob)
    msg = str(info.value)
    assert "byte" in msg and ("lowering" in msg or "exactly" in msg)


def _check_never_crashes(blob: bytes) -> None:
    try:
        s = parse_vela_stream(blob)
    except VelaStreamError:
        return
    assert isinstance(s, VelaStream)
    assert parse_vela_stream(pack_vela_stream(s)) == s


def test_fuzz_truncations_and_flips(compiled):
    valid = compiled["ethos-u55-128"].blob
    for n in range(len(valid)):
        with pytest.raises(VelaStreamError):
            parse_vela_stream(valid[:n])
    rng = random.Random(1234)
    for _ in range(600):
        b = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.7 else b[i] ^ (1 << rng.randrange(8))
        _check_never_crashes(bytes(b))
    # header fields specifically: lengths, counts and flags
    header_offsets = [i for i in range(0, len(valid), 16) if valid[i:i + 4] in (b"vela", b"cmd_", b"weig",
                                                                                  b"scra", b"inpu", b"outp")]
    for off in header_offsets:
        for delta in (16, 17, 20, 21, 32, 36):
            for value in (0, 1, 2, 0x7F, 0xFF):
                if off + delta >= len(valid):
                    continue
                b = bytearray(valid)
                b[off + delta] = value
                _check_never_crashes(bytes(b))
    for _ in range(200):
        _check_never_crashes(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200))))


# ----------------------------------------------------------------------------- from_vela_npz


def _npz_arrays() -> dict[str, np.ndarray]:
    return {
        "cmd_data": np.array(b"COP1\0\0", dtype="S6"),
        "weight_data": np.frombuffer(b"\1\2\3", np.uint8),
        "scratch_shape": np.array([768], np.int64),
        "input_shape": np.array([[1, 1, 1, 8, 8, 4]], np.int64),
        "input_elem_size": np.array([1], np.int64),
        "input_offset": np.array([np.iinfo(np.uint64).max], np.uint64),
        "input_region": np.array([1], np.int64),
        "output_shape": np.zeros((0,), np.float64),
        "output_elem_size": np.zeros((0,), np.float64),
        "output_offset": np.zeros((0,), np.float64),
        "output_region": np.zeros((0,), np.float64),
        "input_quantization": np.array([{"scale": 1.0}], dtype=object),  # never read
    }


def test_from_vela_npz(tmp_path):
    path = tmp_path / "ok.npz"
    np.savez(path, **_npz_arrays())
    s = from_vela_npz(path)
    assert s == VelaStream(b"COP1\0\0", b"\1\2\3", 768, (VelaIO((1, 1, 1, 8, 8, 4), 1, -1, 1),), ())
    assert parse_vela_stream(pack_vela_stream(s)) == s


@pytest.mark.parametrize("change, match", [
    ({"cmd_data": None}, "no 'cmd_data' array"),
    ({"weight_data": np.array([{"a": 1}], dtype=object)}, "without pickle"),
    ({"weight_data": np.zeros(3, np.float32)}, "should be bytes"),
    ({"scratch_shape": np.array([1, 2], np.int64)}, "1-element integer array"),
    ({"scratch_shape": np.array([1 << 40], np.int64)}, "does not fit in uint32"),
    ({"input_shape": np.ones((1, 5), np.int64)}, "rows have 5 dims"),
    ({"input_shape": np.ones((1, 6), np.float32)}, "2-D integer array"),
    ({"input_offset": np.array([0, 1], np.int64)}, "has 2 entries, expected 1"),
    ({"input_region": np.array([1 << 40], np.int64)}, "outside int32"),
    ({"output_region": np.array([1], np.int64)}, "has 1 entries, expected 0"),
])
def test_from_vela_npz_refuses(tmp_path, change, match):
    arrays = {k: v for k, v in {**_npz_arrays(), **change}.items() if v is not None}
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(VelaStreamError, match=match):
        from_vela_npz(path)


def test_from_vela_npz_not_an_archive(tmp_path):
    with pytest.raises(VelaStreamError, match="cannot open"):
        from_vela_npz(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK\3\4" + bytes(100))
    with pytest.raises(VelaStreamError, match="cannot open"):
        from_vela_npz(tmp_path / "junk.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(VelaStreamError, match="single array"):
        from_vela_npz(tmp_path / "single.npy")
