"""CoreMLBackend's compile specs: ExecuTorch's keys and bytes, refusals with reasons."""

from __future__ import annotations

import pytest

from edgeport.backend import CompileSpec
from edgeport_coreml import CoreMLBackend, CoreMLCompileSpec, generate_compile_specs


def _pairs(specs):
    return [(s.key, bytes(s.value)) for s in specs]


def test_defaults_are_executorchs():
    assert _pairs(generate_compile_specs()) == [("compute_units", b"all"), ("min_deployment_target", b""),
                                                ("model_compute_precision", b"float16"), ("model_type", b"model")]
    assert CoreMLBackend.generate_compile_specs() == generate_compile_specs()


def test_round_trip_and_names():
    specs = generate_compile_specs(compute_unit="CPU_ONLY", minimum_deployment_target="iOS17",
                                   compute_precision="float32", model_type="compiled_model")
    assert _pairs(specs)[:3] == [("compute_units", b"cpu_only"), ("min_deployment_target", b"8"),
                                 ("model_compute_precision", b"float32")]
    opts = CoreMLCompileSpec.from_compile_specs(specs)
    assert (opts.compute_unit, opts.minimum_deployment_target, opts.compute_precision, opts.model_type) == (
        "cpu_only", 8, "float32", "compiled_model")
    assert CoreMLCompileSpec.from_compile_specs([]) == CoreMLCompileSpec()


@pytest.mark.executorch
def test_same_bytes_as_executorch():
    pytest.importorskip("executorch.backends.apple.coreml.compiler")
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend as EtCoreMLBackend

    for kw in ({}, {"compute_unit": ct.ComputeUnit.CPU_AND_NE, "minimum_deployment_target": ct.target.iOS18,
                    "compute_precision": ct.precision.FLOAT32},
               {"minimum_deployment_target": ct.target.macOS13, "model_type": EtCoreMLBackend.MODEL_TYPE.MODEL}):
        ours = generate_compile_specs(**kw)
        assert _pairs(ours) == _pairs(EtCoreMLBackend.generate_compile_specs(**kw))
        et_specs = EtCoreMLBackend.generate_compile_specs(**kw)
        opts = CoreMLCompileSpec.from_compile_specs([CompileSpec(s.key, s.value) for s in et_specs])
        assert opts.to_compile_specs() == ours


@pytest.mark.parametrize("kwargs, match", [
    ({"compute_unit": "tpu"}, "unknown Core ML compute unit"),
    ({"minimum_deployment_target": "iOS99"}, "unknown Core ML deployment target"),
    ({"minimum_deployment_target": "iOS15"}, "older than iOS16"),
    ({"compute_precision": "int8"}, "unknown Core ML compute precision"),
    ({"model_type": "zip"}, "unknown Core ML model type"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoreMLCompileSpec(**kwargs)


def test_unknown_and_unimplemented_keys():
    with pytest.raises(ValueError, match="unknown compile spec 'tosa_spec'"):
        CoreMLCompileSpec.from_compile_specs([CompileSpec("tosa_spec", b"TOSA-1.0+INT")])
    with pytest.raises(ValueError, match="pass pipelines are not implemented"):
        CoreMLCompileSpec.from_compile_specs([CompileSpec("pass_pipeline", b"[]")])
    with pytest.raises(ValueError, match="not UTF-8"):
        CoreMLCompileSpec.from_compile_specs([CompileSpec("compute_units", b"\xff")])
