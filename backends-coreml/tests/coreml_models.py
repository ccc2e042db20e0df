"""Small models, lowering helpers and package readers shared by the Core ML backend's tests."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgeport import to_edge_transform_and_lower
from edgeport.program.reader import load_pte
from edgeport_coreml import CoreMLPartitioner, generate_compile_specs


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Hardswish(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(x))


class SmallCnn(nn.Module):
    """conv+relu, max pool, depthwise conv + relu6 + residual, global mean, linear, softmax (no batch norm, so
    the weights reach Core ML unfused and can be compared)."""

    def __init__(self, explicit: bool = False) -> None:
        super().__init__()
        self.stride = 2 if explicit else None
        self.bounds = (0.0, 6.0) if explicit else (0, 6)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2, self.stride)
        y = nn.functional.hardtanh(self.dw(y), *self.bounds) + y
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), -1)


MODELS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "mlp": (Mlp, (1, 32)),
    "cnn": (SmallCnn, (1, 3, 16, 16)),
    # the same CNN with max_pool2d's stride written out and float relu6 bounds: ExecuTorch 1.5.1 + coremltools 9.0
    # fail on the default stride ("expected minimum 3 inputs") and on integer hardtanh bounds ("alpha has dtype
    # int32"); edgeport's preprocess rewrites both itself
    "cnn_explicit": (lambda: SmallCnn(explicit=True), (1, 3, 16, 16)),
}


def build(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    return cls().eval(), torch.randn(shape)


@dataclass
class Lowered:
    model: nn.Module
    example: torch.Tensor
    program: bytes
    partitioner: Any

    def blob(self, index: int = 0) -> bytes:
        return bytes(load_pte(self.program).delegate_data(0, index))

    @property
    def num_delegates(self) -> int:
        return len(load_pte(self.program).program.execution_plan[0].delegates)


@functools.cache
def lowered(name: str, precision: str = "float32") -> Lowered:
    model, x = build(name)
    partitioner = CoreMLPartitioner(generate_compile_specs(compute_precision=precision,
                                                           minimum_deployment_target="iOS16"))
    ep = torch.export.export(model, (x,))
    program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer
    return Lowered(model, x, bytes(program), partitioner)


def load_package(blob: bytes, directory: str | None = None) -> tuple[Path, Any]:
    """Unflatten with edgeport's reader and load the package with coremltools (not compiled: works on Linux)."""
    import coremltools as ct

    from edgeport_coreml.schema.flat_directory import unflatten_to

    root = unflatten_to(blob, directory or tempfile.mkdtemp())
    return root, ct.models.MLModel(str(root / "model.mlpackage"), skip_model_load=True)


def mil_consts(package: Path, spec: Any) -> list[np.ndarray]:
    """Every const tensor of the ML program (values read back from the package's weight file)."""
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil

    weights = package / "Data" / "com.apple.CoreML" / "weights"
    prog = load_mil(spec, spec.specificationVersion, str(weights))
    out = []
    for function in prog.functions.values():
        for op in function.operations:
            if op.op_type == "const" and op.outputs[0].val is not None:
                v = np.asarray(op.outputs[0].val)
                if v.ndim > 0:
                    out.append(v)
    return out


def mil_ops(spec: Any) -> list[str]:
    return [op.type for f in spec.mlProgram.functions.values() for b in f.block_specializations.values()
            for op in b.operations]


def patched_program(program: bytes, blob: bytes) -> bytes:
    """The program with its delegate blob overwritten in place by a same-length corrupted copy."""
    at = program.find(blob)
    assert at > 0
    damaged = bytearray(blob)
    damaged[-30:] = bytes(b ^ 0x5A for b in damaged[-30:])
    return program[:at] + bytes(damaged) + program[at + len(blob):]
