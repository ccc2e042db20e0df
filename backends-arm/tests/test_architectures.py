"""Real architectures in int8 on Ethos-U: every architecture of ``edgeport.testing.architectures`` (Hugging Face
models from small configs, random weights) quantized with ``EthosUQuantizer``, lowered with ``EthosUPartitioner``
(Vela in its isolated worker; what the NPU cannot run stays on the CPU) and run on edgeport's runtime (Arm's TOSA
reference model executes the delegates).

Oracle: the pt2e-converted model (4 random calibration batches, then the example). The program's SQNR against fp32
eager must be within 1 dB of the converted model's own SQNR against eager; the share of compute ops inside Ethos-U
delegates must not drop below what ``bench/arm_architectures.py`` measured (which also prints ExecuTorch's
partitioner's share on the same export). ResNet in the default run, the rest with ``-m slow``.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, eager_outputs
from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer

pytest.importorskip("transformers")

TARGET = "ethos-u55-128"
DEFAULT = ("resnet",)
# share of compute ops (quantize / dequantize not counted) inside Ethos-U delegates, measured 2026-11-28
# (bench/arm_architectures.py, U55-128); a drop below it is a regression
FLOORS = {"bert": 0.99, "distilbert": 0.99, "gpt2": 0.96, "llama": 0.99, "qwen2": 0.99, "vit": 1.0}
_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel")


def _sqnr(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(10 * np.log10((want ** 2).sum() / max(((got - want) ** 2).sum(), 1e-30)))


def _compute(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target is not operator.getitem
            and not any(k in str(node.target) for k in _QDQ))


def _share(program) -> float:  # type: ignore[no-untyped-def]
    inside = outside = 0
    for n in program.graph.nodes:
        if is_call_delegate(n):
            inside += sum(1 for m in lookup_lowered_module(n.args[0]).original_module.graph.nodes if _compute(m))
        elif _compute(n):
            outside += 1
    return inside / max(1, inside + outside)


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ARCHITECTURES)])
def test_int8_on_ethos_u_is_within_1_db_of_its_pt2e_model(name):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    arch = ARCHITECTURES[name]()
    inputs = tuple(arch.example_inputs)
    spec = EthosUCompileSpec(TARGET)
    prepared = prepare_pt2e(torch.export.export(arch.model, inputs).module(), EthosUQuantizer(spec))
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = inputs[0]
        prepared(torch.randint(0, arch.vocab, x.shape, generator=gen) if arch.kind == "text"
                 else torch.randn(x.shape, generator=gen))
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    edge = to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                       partitioner=[EthosUPartitioner(spec, cpu_fallback=True)])
    share = _share(edge.exported_program())
    assert share >= FLOORS.get(name, 0.5), f"{name}: {share:.1%} of compute ops on Ethos-U"
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    got = np.asarray(method.execute([t.numpy() for t in inputs])[0])
    eager = eager_outputs(arch)
    ours, theirs = _sqnr(got, eager), _sqnr(oracle, eager)
    assert ours >= theirs - 1.0, f"{name}: Ethos-U {ours:.1f} dB vs eager; its pt2e model {theirs:.1f} dB " \
                                 f"(Ethos-U vs pt2e {_sqnr(got, oracle):.1f} dB)"
