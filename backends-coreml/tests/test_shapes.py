"""Dynamic input shapes: the export's range (``torch.export.Dim``) becomes Core ML's shape range by default, the
``enumerated_shapes`` compile spec (ExecuTorch's key and JSON) gives ``ct.EnumeratedShapes``. Checked on the
model's input description, which loads on Linux; ExecuTorch 1.5.1 writes the same spec bytes and the same input
description for the same program (the oracle)."""

from __future__ import annotations

import functools

import pytest
import torch
from coreml_models import build, load_package
from torch.export import Dim

from edgeport import to_edge_transform_and_lower
from edgeport.backend import CompileSpec
from edgeport.errors import LoweringError
from edgeport.program.reader import load_pte
from edgeport_coreml import CoreMLCompileSpec, CoreMLPartitioner, generate_compile_specs
from edgeport_coreml.shapes import generate_enumerated_shapes_compile_spec

SHAPES = [[1, 32], [4, 32], [16, 32]]


@functools.cache
def _dynamic_mlp(low: int = 1):
    model, _ = build("mlp")
    x = torch.randn(4, 32)
    return model, torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", min=low, max=64)},))


def _input_of(specs, low: int = 1) -> object:
    _model, ep = _dynamic_mlp(low)
    program = to_edge_transform_and_lower(ep, partitioner=[CoreMLPartitioner(specs)]).to_executorch().buffer
    _root, mlmodel = load_package(bytes(load_pte(program).delegate_data(0, 0)))
    (inp,) = mlmodel.get_spec().description.input
    return inp.type.multiArrayType


def test_range_from_the_export_by_default():
    t = _input_of(generate_compile_specs(minimum_deployment_target="iOS16", compute_precision="float32"))
    assert t.WhichOneof("ShapeFlexibility") == "shapeRange"
    assert [(r.lowerBound, r.upperBound) for r in t.shapeRange.sizeRanges] == [(1, 64), (32, 32)]


def test_enumerated_shapes():
    _model, ep = _dynamic_mlp()
    spec = generate_enumerated_shapes_compile_spec(ep, {"x": SHAPES})
    t = _input_of(generate_compile_specs(minimum_deployment_target="iOS16", compute_precision="float32") + [spec])
    assert t.WhichOneof("ShapeFlexibility") == "enumeratedShapes"
    assert [list(s.shape) for s in t.enumeratedShapes.shapes] == SHAPES
    assert list(t.shape) == SHAPES[0]  # the default shape is the first one
    assert CoreMLCompileSpec.from_compile_specs([spec]).to_compile_specs()[-1] == spec


@pytest.mark.executorch
def test_same_spec_and_input_description_as_executorch():
    pytest.importorskip("executorch.backends.apple.coreml.partition")
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    # Dim(min=2): ExecuTorch 1.5.1 keys enumerations by (symbol, low, high), and its edge program reports a Dim
    # declared with min=1 as low=2, so its own lowering cannot find the enumeration (edgeport matches by symbol)
    _model, ep = _dynamic_mlp(2)
    et_spec = CoreMLBackend.generate_enumerated_shapes_compile_spec(ep, {"x": SHAPES})
    ours = generate_enumerated_shapes_compile_spec(ep, {"x": SHAPES})
    assert (et_spec.key, bytes(et_spec.value)) == (ours.key, bytes(ours.value))
    specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT32,
                                                 minimum_deployment_target=ct.target.iOS16) + [et_spec]
    edge = et_lower(ep, partitioner=[EtPartitioner(compile_specs=specs, lower_full_graph=True)])
    _root, mlmodel = load_package(bytes(edge.exported_program().graph_module.lowered_module_0.processed_bytes))
    theirs = mlmodel.get_spec().description.input[0].type.multiArrayType
    mine = _input_of(generate_compile_specs(minimum_deployment_target="iOS16", compute_precision="float32") + [ours],
                     low=2)
    assert theirs.enumeratedShapes == mine.enumeratedShapes and list(theirs.shape) == list(mine.shape)


@pytest.mark.parametrize("shapes, match", [
    ({"x": [[1, 32], [128, 32]]}, "outside the exported range"),
    ({"x": [[1, 32], [4, 16]]}, "differs from the static size 32"),
    ({"x": [[4, 32]]}, "at least two shapes"),
    ({}, "gives no shapes for it"),
    ({"x": SHAPES, "y": SHAPES}, "not inputs of the program"),
])
def test_bad_enumerations(shapes, match):
    _model, ep = _dynamic_mlp()
    with pytest.raises(ValueError, match=match):
        generate_enumerated_shapes_compile_spec(ep, shapes)


def test_static_program_and_bad_json():
    model, x = build("mlp")
    with pytest.raises(ValueError, match="no dynamic input"):
        generate_enumerated_shapes_compile_spec(torch.export.export(model, (x,)), {"x": SHAPES})
    with pytest.raises(ValueError, match="not JSON"):
        CoreMLCompileSpec.from_compile_specs([CompileSpec("enumerated_shapes", b"[[{")])


class _TwoInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) @ b


def test_two_enumerated_inputs_need_ios18():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    ep = torch.export.export(_TwoInputs(), (a, b), dynamic_shapes=({0: Dim("m", max=16)}, {1: Dim("n", max=16)}))
    spec = generate_enumerated_shapes_compile_spec(ep, {"a": [[2, 8], [4, 8]], "b": [[8, 3], [8, 6]]})
    with pytest.raises(LoweringError, match="more than one enumerated input needs minimum_deployment_target iOS18"):
        to_edge_transform_and_lower(ep, partitioner=[CoreMLPartitioner(
            generate_compile_specs(minimum_deployment_target="iOS17", compute_precision="float32") + [spec])])
