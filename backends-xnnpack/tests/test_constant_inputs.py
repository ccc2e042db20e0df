"""Static operands XNNPACK does not pack reach the delegate as program constants (call arguments), as in ExecuTorch.

ExecuTorch 1.3.1 (executorch-numpy-runtime 1.4.0) frees a delegate's named data after ``init`` when it loads a
program from a file; XNNPACK still points at the static operands it does not pack, so those programs computed
garbage there. These tests pin the layout (only packed weights in named data, every other static operand a delegate
argument backed by a constant tensor), check edgeport's runtime and the stock ExecuTorch 1.5.1 runtime give the
same bits, and -- when the bench's peer venv exists -- that ExecuTorch 1.3.1 loading the file gives them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport.runtime import Runtime
from edgeport.testing.stock_runtime import run_cases
from edgeport_xnnpack import XnnpackPartitioner
from edgeport_xnnpack.preprocess.constant_inputs import PACKED_FIELDS
from edgeport_xnnpack.schema.graph import CAT_INPUTS, INPUT_FIELDS, node_layout
from edgeport_xnnpack.schema.reader import read_blob

PEER_HOME = Path(os.environ.get("EDGEPORT_BENCH_HOME", Path.home() / ".cache" / "edgeport-bench"))
PEER_PYTHON = PEER_HOME / "peer-executorch-numpy-runtime-1.4.0" / "bin" / "python"


class Operands(torch.nn.Module):
    """Every kind of static operand: a scalar divisor and addend, a per-channel multiplier, a layer norm's weight
    and bias, a class token concatenated to the input, a position embedding, and a Linear's (packed) weights --
    the Linear's bias also added once more outside it (a packed and an unpacked use of one constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.pos = torch.nn.Parameter(torch.randn(1, 5, 16))
        self.scale = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.ln = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        h = self.ln(h / 3.0 + 1.0) * self.scale
        return self.fc(h) + self.fc.bias


def _program() -> tuple[torch.nn.Module, torch.Tensor, bytes]:
    torch.manual_seed(0)
    model, x = Operands().eval(), torch.randn(2, 4, 16)
    ep = torch.export.export(model, (x,))
    return model, x, to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def _static_uses(graph) -> list[tuple[str, str]]:
    statics = {v.id_out for v in graph.values if v.constant_buffer_idx}
    out = []
    for node in graph.nodes:
        fields = ([f"input{i + 1}_id" for i in range(CAT_INPUTS[node.kind])] if node.kind in CAT_INPUTS
                  else [f for f, _ in node_layout(node.kind) if f in INPUT_FIELDS])
        out += [(node.kind, f) for f in fields if node.get(f) in statics]
    return out


def test_only_packed_weights_stay_static_and_the_rest_are_constant_arguments():
    model, x, pte = _program()
    lp = load_pte(pte)
    plan = lp.program.execution_plan[0]
    assert len(plan.delegates) == 1
    graph, _ = read_blob(lp.delegate_data(0, 0))
    uses = _static_uses(graph)
    assert uses and all(f in PACKED_FIELDS.get(kind, ()) for kind, f in uses), uses
    assert {kind for kind, _ in uses} == {"XNNFullyConnected"}
    externals = sorted(v.external_id for v in graph.values if v.flags)
    assert externals == list(range(graph.num_externs))
    call = next(i for i in plan.chains[0].instructions if type(i.instr_args).__name__ == "DelegateCall")
    args = call.instr_args.args
    assert len(args) == len(graph.input_ids) + len(graph.output_ids)
    constant = [plan.values[a].val.data_buffer_idx > 0 for a in args[:len(graph.input_ids)]]
    # the partition's own arguments (the expanded class token, x), then the constants it reads unpacked: pos,
    # the divisor, the addend, the layer norm's weight and bias, the multiplier, the Linear's bias (its second use)
    assert constant == [False, False] + [True] * (len(constant) - 2) and len(constant) - 2 >= 7, constant
    with torch.no_grad():
        want = model(x).numpy()
    got = Runtime.get().load_program(pte).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lowered_module_alone_and_eagerly():
    from edgeport import to_edge
    from edgeport.aot.to_backend import to_backend

    torch.manual_seed(0)
    model, x = Operands().eval(), torch.randn(2, 4, 16)
    edge = to_edge(torch.export.export(model, (x,)))
    module = to_backend("XnnpackBackend", edge.exported_program(), [])
    assert module.constant_inputs, "the whole program has unpacked static operands"
    with torch.no_grad():
        want = model(x).numpy()
        np.testing.assert_allclose(module(x).numpy(), want, rtol=1e-6, atol=1e-6)  # eager: the original program
    got = Runtime.get().load_program(module.buffer()).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    class Composed(torch.nn.Module):  # the lowered module inside another exported module: constants lifted
        def __init__(self) -> None:
            super().__init__()
            self.lowered = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lowered(x) * 2

    pte = to_edge(torch.export.export(Composed(), (x,))).to_executorch().buffer
    got = Runtime.get().load_program(pte).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want * 2, rtol=1e-5, atol=1e-5)


def _lowered(model: torch.nn.Module, inputs: list[torch.Tensor]) -> bytes:
    ep = torch.export.export(model, tuple(inputs))
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def _arch(arch: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    if arch == "operands":
        torch.manual_seed(0)
        return Operands().eval(), [torch.randn(2, 4, 16)]
    from edgeport.testing.architectures import ARCHITECTURES

    a = ARCHITECTURES[arch](seed=0, size="small")
    return a.model, list(a.example_inputs)


@pytest.mark.executorch
@pytest.mark.parametrize("arch", ["operands", "vit", pytest.param("llama", marks=pytest.mark.slow)])
def test_both_runtimes_give_the_bits_of_the_all_named_data_layout(monkeypatch, arch):
    """The layout changes where operands live, not what XNNPACK computes: each runtime's output equals, bit for bit,
    its output for the previous layout (every static operand in named data), and both are close to eager."""
    import edgeport_xnnpack.preprocess as preprocess

    model, inputs = _arch(arch)
    new = _lowered(model, inputs)
    monkeypatch.setattr(preprocess, "externalize_unpacked", lambda graph, data: [])
    old = _lowered(model, inputs)
    assert old != new
    xs = [t.numpy() for t in inputs]
    stock = run_cases([(f"{arch}-new", new, "forward", inputs), (f"{arch}-old", old, "forward", inputs)])
    assert all(r.ok for r in stock), "\n".join(f"{r.describe()}\n{r.log}" for r in stock)
    np.testing.assert_array_equal(stock[0].outputs[0], stock[1].outputs[0])
    ours = [Runtime.get().load_program(p).load_method("forward").execute(xs)[0] for p in (new, old)]
    np.testing.assert_array_equal(ours[0], ours[1])
    with torch.no_grad():
        want = model(*inputs).numpy()
    for got in (ours[0], stock[0].outputs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


_PEER_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, executorch_numpy_runtime as en
    pte, x, out = sys.argv[1:]
    xs = [np.load(x)]
    from_file = en.Runtime.get().load_program(pte).load_method("forward")  # from the path, as on a device
    from_bytes = en.Runtime.get().load_program(open(pte, "rb").read()).load_method("forward")
    np.save(out, np.stack([np.asarray(from_file(xs)[0]), np.asarray(from_bytes(xs)[0])]))
""")


@pytest.mark.skipif(not PEER_PYTHON.exists(), reason=f"no executorch-numpy-runtime venv at {PEER_PYTHON} "
                    "(bench/runtime_peer.py makes it where a Python >= 3.12 exists)")
@pytest.mark.parametrize("arch", ["operands", "vit", "llama"])
def test_executorch_1_3_loads_the_file(tmp_path, arch):
    """ExecuTorch 1.3.1 loading the file computes what it computes from bytes (it read freed memory before)."""
    model, inputs = _arch(arch)
    if len(inputs) != 1:
        pytest.skip(f"{arch} takes {len(inputs)} inputs; the peer script passes one")
    (tmp_path / "p.pte").write_bytes(_lowered(model, inputs))
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    run = subprocess.run([str(PEER_PYTHON), "-c", _PEER_SCRIPT, str(tmp_path / "p.pte"), str(tmp_path / "x.npy"),
                          str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    from_file, from_bytes = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(from_file, from_bytes)
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(from_file, want, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
