"""End to end: pt2e-quantized programs whose quantize/dequantize ops stay outside any delegate.

torchao's ``prepare_pt2e``/``convert_pt2e`` quantize small models; edgeport lowers them without a partitioner (or
with XNNPACK and a partition boundary), and both edgeport's runtime and the stock ExecuTorch 1.5.1 runtime run
the ``.pte``. The oracle is the quantized eager model (the ``convert_pt2e`` module): outputs match it exactly or
within one quantization step of the output (float rounding in conv/linear may move a value across a rounding
boundary of a requantization).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
from torch import nn  # noqa: E402
from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver, PlaceholderObserver  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)

import edgeport  # noqa: E402
from edgeport.errors import RuntimeExecutionError  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402

Q = torch.ops.quantized_decomposed


class ConvReluLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class DynamicLinearQuantizer(Quantizer):
    """Dynamic int8 activations (``choose_qparams`` at run time) and per-channel int8 weights for every linear."""

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        act = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                               is_dynamic=True, observer_or_fake_quant_ctr=PlaceholderObserver.with_args(
                                   dtype=torch.int8, is_dynamic=True))
        weight = QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, ch_axis=0,
                                  qscheme=torch.per_channel_symmetric,
                                  observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2 ** -12))
        for node in model.graph.nodes:
            if node.target is torch.ops.aten.linear.default:
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={node.args[0]: act, node.args[1]: weight}, _annotated=True)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        pass


def seeded(shape: tuple[int, ...], seed: int, count: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(count)]


def quantize(model: nn.Module, example: torch.Tensor, quantizer: Quantizer) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(torch.export.export(model.eval(), (example,)).module(), quantizer)
    with torch.no_grad():
        for x in seeded(tuple(example.shape), 1234, 4):
            prepared(x)
    return convert_pt2e(prepared)


def static_quantized(per_channel: bool) -> tuple[torch.fx.GraphModule, torch.Tensor]:
    quantizer = pytest.importorskip("edgeport_xnnpack.quantizer").XnnpackQuantizer
    torch.manual_seed(0)
    example = torch.randn(1, 3, 8, 8)
    return quantize(ConvReluLinear(), example, quantizer(per_channel=per_channel, observer="minmax")), example


def output_step(gm: torch.fx.GraphModule) -> float:
    """The scale of the final dequantize: one quantization step of the output."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert out.target is Q.dequantize_per_tensor.default
    return float(out.args[1])


def operator_names(et) -> set[str]:
    return {f"{op.name}.{op.overload}" for op in et.executorch_program.execution_plan[0].operators}


def run_edgeport(pte: bytes, inputs: list[torch.Tensor]) -> np.ndarray:
    method = Runtime.get().load_program(pte).load_method("forward")
    return np.stack([method.execute([x.numpy()])[0] for x in inputs])


def executorch_runtime():
    """The stock ExecuTorch runtime with its quantized kernel library registered (the pip wheel's pybindings
    have only the portable kernels; ``executorch.kernels.quantized`` adds the ``quantized_decomposed`` ones)."""
    pytest.importorskip("executorch")
    import executorch.kernels.quantized  # noqa: F401
    from executorch.extension.pybindings.portable_lib import _get_operator_names
    from executorch.runtime import Runtime as EtRuntime

    return EtRuntime.get(), set(_get_operator_names())


def run_executorch(pte: bytes, inputs: list[torch.Tensor]) -> np.ndarray:
    runtime, _ = executorch_runtime()
    program = runtime.load_program(pte)  # keep the program alive while its method runs
    method = program.load_method("forward")
    return np.stack([method.execute([x])[0].numpy() for x in inputs])


def eager(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return np.stack([gm(x).numpy() for x in inputs])


def assert_within_one_step(got: np.ndarray, want: np.ndarray, step: float) -> float:
    """Every element equals ``want`` or is one ``step`` away; returns the fraction that is exact."""
    steps = np.abs(got.astype(np.float64) - want) / step
    assert steps.max() <= 1.0 + 1e-4, f"{steps.max():.3f} quantization steps apart"
    return float((got == want).mean())


@pytest.mark.executorch
@pytest.mark.parametrize("per_channel", [True, False])
def test_static_quantized_program_without_partitioner(per_channel):
    gm, example = static_quantized(per_channel)
    et = edgeport.to_edge_transform_and_lower(torch.export.export(gm, (example,))).to_executorch()
    ops = operator_names(et)
    assert {"quantized_decomposed::quantize_per_tensor.out", "quantized_decomposed::dequantize_per_tensor.out"} <= ops
    assert ("quantized_decomposed::dequantize_per_channel.out" in ops) == per_channel
    inputs = seeded((1, 3, 8, 8), 7, 8)
    want, step = eager(gm, inputs), output_step(gm)
    ours = run_edgeport(et.buffer, inputs)
    assert assert_within_one_step(ours, want, step) >= 0.95
    _, registered = executorch_runtime()
    assert ops <= registered, f"not in ExecuTorch's runtime: {sorted(ops - registered)}"
    theirs = run_executorch(et.buffer, inputs)
    assert assert_within_one_step(theirs, want, step) >= 0.95


@pytest.mark.executorch
def test_dynamic_quantized_program_without_partitioner():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    example = torch.randn(3, 16)
    gm = quantize(model, example, DynamicLinearQuantizer())
    et = edgeport.to_edge(torch.export.export(gm, (example,))).to_executorch()
    ops = operator_names(et)
    assert {"quantized_decomposed::choose_qparams.Tensor_out", "quantized_decomposed::quantize_per_tensor.Tensor_out",
            "quantized_decomposed::dequantize_per_tensor.Tensor_out"} <= ops
    inputs = seeded((3, 16), 11, 6)
    want = eager(gm, inputs)
    np.testing.assert_allclose(run_edgeport(et.buffer, inputs), want, rtol=1e-5, atol=1e-5)
    _, registered = executorch_runtime()
    assert ops <= registered
    np.testing.assert_allclose(run_executorch(et.buffer, inputs), want, rtol=1e-5, atol=1e-5)


class ConvCumsumLinear(ConvReluLinear):
    """XNNPACK has no cumsum: the quantized conv and linear are delegated, cumsum and (with the partitioner's node
    filter) the dequantize/quantize ops next to it are not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cumsum(torch.relu(self.conv(x)), 1).flatten(1))


@pytest.mark.executorch
def test_partition_boundary_in_quantized_model():
    pytest.importorskip("edgeport_xnnpack")
    from edgeport_xnnpack import native
    from edgeport_xnnpack.partitioner import XnnpackPartitioner
    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    if not native.is_available()[0]:
        pytest.skip("XNNPACK native library unavailable")
    torch.manual_seed(0)
    example = torch.randn(1, 3, 8, 8)
    gm = quantize(ConvCumsumLinear(), example, XnnpackQuantizer(observer="minmax"))

    def near_cumsum(node: torch.fx.Node, hops: int = 2) -> bool:
        near = {node}
        for _ in range(hops):
            near |= {m for n in near for m in [*n.all_input_nodes, *n.users]}
        return any("cumsum" in str(n.target) for n in near)

    # the q/dq pairs on both sides of cumsum stay outside: the delegates' inputs and outputs are float32
    partitioner = XnnpackPartitioner(node_filter=lambda n: not ("quantize" in str(n.target) and near_cumsum(n)))
    edge = edgeport.to_edge_transform_and_lower(torch.export.export(gm, (example,)), partitioner=[partitioner])
    et = edge.to_executorch()
    assert et.executorch_program.execution_plan[0].delegates, "nothing was delegated to XNNPACK"
    ops = operator_names(et)
    assert {"quantized_decomposed::quantize_per_tensor.out", "quantized_decomposed::dequantize_per_tensor.out",
            "aten::cumsum.out"} <= ops
    inputs = seeded((1, 3, 8, 8), 5, 6)
    want, step = eager(gm, inputs), output_step(gm)
    assert_within_one_step(run_edgeport(et.buffer, inputs), want, step)
    assert_within_one_step(run_executorch(et.buffer, inputs), want, step)


class BadRange(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = Q.quantize_per_tensor(x, 0.1, 0, -1000, 127, torch.int8)  # -1000 is not an int8
        return Q.dequantize_per_tensor(q, 0.1, 0, -1000, 127, torch.int8)


def test_bad_quantization_arguments_fail_cleanly():
    """A program with an invalid quantization range loads, and running it raises a RuntimeExecutionError naming
    the op (not a crash)."""
    x = torch.randn(4)
    et = edgeport.to_edge(torch.export.export(BadRange(), (x,))).to_executorch()
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    with pytest.raises(RuntimeExecutionError, match=r"quantize_per_tensor.*\[-1000, 127\]"):
        method.execute([x.numpy()])


@pytest.mark.executorch
def test_executorch_quantized_library_loads_after_edgeport():
    """edgeport's out variants live in their own namespace: loading ExecuTorch's AOT library afterwards (which
    defines ``quantized_decomposed::*.out`` and aborts the process on a duplicate definition) still works, and the
    out variant chosen then is emitted under the same name."""
    pytest.importorskip("executorch")
    script = (
        "import torch, torch.ao.quantization.fx._decomposed\n"
        "from edgeport.aot.passes.out_variants import out_variant, executorch_name\n"
        "op = torch.ops.quantized_decomposed.quantize_per_tensor.default\n"
        "before = out_variant(op); out_variant.cache_clear()\n"
        "import executorch.kernels.quantized\n"
        "after = out_variant(op)\n"
        "print(executorch_name(before._schema), executorch_name(after._schema), before._overloadname)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["quantized_decomposed::quantize_per_tensor"] * 2 + ["out"]


def test_out_variants_run_in_torch():
    """edgeport's out variants also run in torch (the functional reference op, copied into ``out``), so an
    execution-dialect graph module stays runnable."""
    from edgeport.aot.passes.out_variants import executorch_name, out_variant

    x = torch.randn(4, 5)
    for op, args in [(Q.quantize_per_tensor.default, (x, 0.05, 3, -128, 127, torch.int8)),
                     (Q.choose_qparams.tensor, (x, -128, 127, 1e-7, torch.int8))]:
        out_op = out_variant(op)
        assert executorch_name(out_op._schema) == f"quantized_decomposed::{op._schema.name.split('::')[1]}"
        want = op(*args)
        want = want if isinstance(want, tuple) else (want,)
        outs = {a.name: torch.empty(0, dtype=w.dtype) for a, w in zip(
            [a for a in out_op._schema.arguments if a.is_out], want)}
        out_op(*args, **outs)
        for got, w in zip(outs.values(), want):
            torch.testing.assert_close(got, w, rtol=0, atol=0)
