"""Weight compression chosen by compile specs (``op_linear_quantizer_config``, ``op_palettizer_config``).

Oracle: the eager model's own weights. Each compressed weight is decoded here with numpy from the raw inputs of
its ``constexpr_*`` MIL op (read back from the package, not through coremltools' decompression) and compared to
the parameter it replaced, within the scheme's bound: half a quantization step for linear quantization, the
nearest palette entry for palettization. The blob's weight file gets smaller, and a scheme the deployment target
lacks is refused before conversion. ExecuTorch 1.5.1's own lowering with the same ``op_linear_quantizer_config``
writes the same quantized weights."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from coreml_models import build, load_package, lowered, mil_ops

from edgeport import to_edge_transform_and_lower
from edgeport.backend import CompileSpec
from edgeport.errors import LoweringError
from edgeport.program.reader import load_pte
from edgeport_coreml import CoreMLCompileSpec, CoreMLPartitioner, generate_compile_specs
from edgeport_coreml.schema.flat_directory import read_flat_directory

WEIGHTS = "model.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
T = 256  # weight_threshold: the MLP's three weight matrices (2048, 4096, 512 elements) are compressed, biases not

SCHEMES = {
    "int8_per_channel": ("iOS16", {"op_linear_quantizer_config": {
        "mode": "linear_symmetric", "dtype": "int8", "granularity": "per_channel", "weight_threshold": T}},
        "constexpr_affine_dequantize", 8),
    "uint8_per_tensor": ("iOS16", {"op_linear_quantizer_config": {
        "mode": "linear", "dtype": "uint8", "granularity": "per_tensor", "weight_threshold": T}},
        "constexpr_affine_dequantize", 8),
    "int8_per_channel_ios18": ("iOS18", {"op_linear_quantizer_config": {
        "mode": "linear_symmetric", "dtype": "int8", "granularity": "per_channel", "weight_threshold": T}},
        "constexpr_blockwise_shift_scale", 8),
    "int4_per_block": ("iOS18", {"op_linear_quantizer_config": {
        "mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 16, "weight_threshold": T}},
        "constexpr_blockwise_shift_scale", 4),
    "palette_kmeans_2": ("iOS16", {"op_palettizer_config": {"mode": "kmeans", "nbits": 2, "weight_threshold": T}},
                         "constexpr_lut_to_dense", 2),
    "palette_kmeans_4": ("iOS16", {"op_palettizer_config": {"mode": "kmeans", "nbits": 4, "weight_threshold": T}},
                         "constexpr_lut_to_dense", 4),
    "palette_uniform_6": ("iOS16", {"op_palettizer_config": {"mode": "uniform", "nbits": 6, "weight_threshold": T}},
                          "constexpr_lut_to_dense", 6),
    "palette_kmeans_8": ("iOS16", {"op_palettizer_config": {"mode": "kmeans", "nbits": 8, "weight_threshold": T}},
                         "constexpr_lut_to_dense", 8),
    "palette_grouped_4": ("iOS18", {"op_palettizer_config": {
        "mode": "kmeans", "nbits": 4, "granularity": "per_grouped_channel", "group_size": 8, "weight_threshold": T}},
        "constexpr_lut_to_dense", 4),
}


@functools.cache
def _lowered_blob(scheme: str) -> bytes:
    target, kwargs, _op, _bits = SCHEMES[scheme]
    model, x = build("mlp")
    specs = generate_compile_specs(minimum_deployment_target=target, compute_precision="float32", **kwargs)
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                          partitioner=[CoreMLPartitioner(specs)]).to_executorch().buffer
    return bytes(load_pte(program).delegate_data(0, 0))


def _mil_program(blob: bytes):
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil

    root, mlmodel = load_package(blob)
    spec = mlmodel.get_spec()
    return load_mil(spec, spec.specificationVersion, str(root / "model.mlpackage/Data/com.apple.CoreML/weights")), spec


def _expand(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Repeat a per-block array (one entry per block along each axis) up to ``shape``."""
    for axis, (n, m) in enumerate(zip(shape, a.shape)):
        a = np.repeat(a, n // m, axis=axis)
    return a


def _decode(op) -> tuple[np.ndarray, np.ndarray]:
    """(dequantized weight, per-element error bound) from a constexpr op's raw inputs, with numpy."""
    v = {k: np.asarray(x.val) for k, x in op.inputs.items()}
    if op.op_type == "constexpr_affine_dequantize":
        q, zp, scale, axis = v["quantized_data"], v["zero_point"], v["scale"], int(v["axis"])
        shape = [1] * q.ndim
        shape[axis] = -1
        zp, scale = (np.broadcast_to(a.reshape(shape) if a.ndim else a, q.shape) for a in (zp, scale))
        return (q.astype(np.float64) - zp) * scale, np.abs(scale) / 2
    if op.op_type == "constexpr_blockwise_shift_scale":
        q = v["data"].astype(np.float64)
        scale = _expand(v["scale"], q.shape)
        offset = _expand(v["offset"], q.shape) if "offset" in v else 0.0
        return (q - offset) * scale, np.abs(scale) / 2
    assert op.op_type == "constexpr_lut_to_dense", op.op_type
    lut, indices = v["lut"].astype(np.float64), v["indices"]
    if "shape" in v:  # iOS16 form: flat palette, indices bit-packed (least significant bits first)
        shape = tuple(int(s) for s in v["shape"])
        nbits = int(np.log2(lut.size))
        bits = np.unpackbits(indices, bitorder="little")[: int(np.prod(shape)) * nbits].reshape(-1, nbits)
        idx = (bits.astype(np.int64) << np.arange(nbits)).sum(axis=1).reshape(shape)
        return lut[idx], np.full(shape, np.nan)
    # iOS18 form: one palette per block, lut shape = blocks per axis + (2**nbits, vector size 1)
    idx = indices.astype(np.int64)
    blocks = [np.arange(n) // (n // m) for n, m in zip(idx.shape, lut.shape[:-2])]
    grid = np.meshgrid(*blocks, indexing="ij")
    return lut[(*grid, idx, 0)], np.full(idx.shape, np.nan)


def _compressed_weights(blob: bytes, op_type: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    prog, _spec = _mil_program(blob)
    out = []
    for f in prog.functions.values():
        for op in f.operations:
            if op.op_type.startswith("constexpr_"):
                assert op.op_type == op_type
                w, bound = _decode(op)
                lut = np.asarray(op.inputs["lut"].val) if "lut" in op.inputs else None
                out.append((w, bound, lut))
    return out


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_compressed_weights_decode_to_the_models(scheme):
    target, _kwargs, op_type, nbits = SCHEMES[scheme]
    blob = _lowered_blob(scheme)
    _root, mlmodel = load_package(blob)
    assert op_type in mil_ops(mlmodel.get_spec())
    model, _ = build("mlp")
    params = {tuple(p.shape): p.detach().double().numpy() for n, p in model.named_parameters() if p.numel() > T}
    decoded = _compressed_weights(blob, op_type)
    assert sorted(w.shape for w, _b, _l in decoded) == sorted(params)
    for w, bound, lut in decoded:
        want = params[w.shape]
        err = np.abs(w - want)
        if lut is None:  # linear quantization: within half a step of the weight's own scale
            assert np.all(err <= bound * (1 + 1e-6) + 1e-12), (scheme, float(err.max()))
            steps = (want.max() - want.min()) / (2 ** nbits - 1)
            assert err.max() <= steps  # and the step is the scheme's (a per-tensor range bounds every step)
        else:  # palettization: every weight became a palette entry, the nearest one of its block's palette
            flat_lut = lut.reshape(-1) if lut.ndim == 1 else None
            if flat_lut is not None:
                assert flat_lut.size == 2 ** nbits
                nearest = np.abs(want[..., None] - flat_lut.astype(np.float64)).min(axis=-1)
                assert np.all(err <= nearest + 1e-6), (scheme, float((err - nearest).max()))
            else:
                assert lut.shape[-2] == 2 ** nbits
                groups = want.shape[0] // lut.shape[0]
                for g in range(lut.shape[0]):
                    rows = slice(g * groups, (g + 1) * groups)
                    pal = lut[g, 0, :, 0].astype(np.float64)
                    nearest = np.abs(want[rows][..., None] - pal).min(axis=-1)
                    assert np.all(err[rows] <= nearest + 1e-6)
            assert err.max() <= (want.max() - want.min()) / 2 ** nbits  # no worse than a uniform grid's step


@pytest.mark.parametrize("scheme", ["int8_per_channel", "int4_per_block", "palette_kmeans_2"])
def test_blob_gets_smaller(scheme):
    _target, _kwargs, _op, nbits = SCHEMES[scheme]
    fp32 = len(read_flat_directory(lowered("mlp", "float32").blob()).files[WEIGHTS])
    small = len(read_flat_directory(_lowered_blob(scheme)).files[WEIGHTS])
    model, _ = build("mlp")
    compressed = sum(p.numel() for p in model.parameters() if p.numel() > T)
    # the compressed matrices shrink from 32 bits to about nbits per element (plus scales / palettes)
    assert small < fp32 - compressed * (32 - nbits) / 8 * 0.8, (fp32, small)


@pytest.mark.parametrize("config, why", [
    ({"op_linear_quantizer_config": {"dtype": "int4", "granularity": "per_channel"}}, "4-bit .int4. linear"),
    ({"op_linear_quantizer_config": {"dtype": "int8", "granularity": "per_block"}}, "per_block linear"),
    ({"op_palettizer_config": {"nbits": 3}}, "3-bit palettization"),
    ({"op_palettizer_config": {"nbits": 4, "granularity": "per_grouped_channel"}}, "per_grouped_channel"),
])
@pytest.mark.parametrize("target", [None, "iOS16", "iOS17"])
def test_deployment_target_refuses_what_it_lacks(config, why, target):
    with pytest.raises(ValueError, match=why + ".*needs minimum_deployment_target iOS18"):
        generate_compile_specs(minimum_deployment_target=target, **config)
    assert generate_compile_specs(minimum_deployment_target="iOS18", **config)


def test_refused_at_lowering_too():
    """Specs written by another tool with a scheme the target lacks fail at preprocess with the reason."""
    from edgeport_coreml.preprocess import preprocess_coreml

    specs = generate_compile_specs(minimum_deployment_target="iOS16") + [
        CompileSpec("op_linear_quantizer_config", b'{"dtype": "int4"}')]
    with pytest.raises(LoweringError, match="4-bit .*needs minimum_deployment_target iOS18"):
        preprocess_coreml(None, specs)


@pytest.mark.parametrize("config, match", [
    ({"op_linear_quantizer_config": {"dtype": "int2"}}, "dtype='int2' is not one of"),
    ({"op_linear_quantizer_config": {"bits": 8}}, "unknown field 'bits'"),
    ({"op_palettizer_config": {"mode": "kmeans"}}, "needs nbits"),
    ({"op_palettizer_config": {"nbits": 5}}, "nbits=5 is not one of"),
    ({"op_linear_quantizer_config": {}, "op_palettizer_config": {"nbits": 4}}, "not both"),
])
def test_bad_compression_configs(config, match):
    with pytest.raises(ValueError, match=match):
        generate_compile_specs(minimum_deployment_target="iOS18", **config)


def test_round_trip():
    cfg = {"mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 32}
    specs = generate_compile_specs(minimum_deployment_target="iOS18", op_linear_quantizer_config=cfg)
    assert CoreMLCompileSpec.from_compile_specs(specs).op_linear_quantizer_config == cfg
    with pytest.raises(ValueError, match="not a JSON object"):
        CoreMLCompileSpec.from_compile_specs([CompileSpec("op_palettizer_config", b"{nbits: 4")])


@pytest.mark.executorch
def test_executorch_writes_the_same_quantized_weights():
    pytest.importorskip("executorch.backends.apple.coreml.partition")
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    cfg = SCHEMES["int8_per_channel"][1]["op_linear_quantizer_config"]
    et_specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT32,
                                                    minimum_deployment_target=ct.target.iOS16,
                                                    op_linear_quantizer_config=cfg)
    ours = generate_compile_specs(compute_precision="float32", minimum_deployment_target="iOS16",
                                  op_linear_quantizer_config=cfg)
    assert [(s.key, bytes(s.value)) for s in et_specs] == [(s.key, bytes(s.value)) for s in ours]
    model, x = build("mlp")
    edge = et_lower(torch.export.export(model, (x,)), partitioner=[EtPartitioner(compile_specs=et_specs)])
    et_blob = bytes(edge.exported_program().graph_module.lowered_module_0.processed_bytes)
    theirs = _compressed_weights(et_blob, "constexpr_affine_dequantize")
    mine = _compressed_weights(_lowered_blob("int8_per_channel"), "constexpr_affine_dequantize")
    assert len(theirs) == len(mine) == 3
    for (a, _, _), (b, _, _) in zip(sorted(theirs, key=lambda t: t[0].shape), sorted(mine, key=lambda t: t[0].shape)):
        np.testing.assert_array_equal(a, b)
