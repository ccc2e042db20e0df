"""Planned memory of delegate calls in lowered programs: the memory planner never gives a delegate output bytes
of one of that call's inputs (outputs are live from the call), in programs edgeport writes and in programs the
stock ExecuTorch 1.5.1 writes. That is what makes passing planned outputs to ``execute(..., out=)`` safe; the
runtime checks it again at load and passes ``None`` where it does not hold."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgeport.program import schema as S  # noqa: E402
from edgeport.program.reader import load_pte  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402


def _planned(vals, i):
    v = vals[i].val
    if type(v) is not S.Tensor or v.allocation_info is None:
        return None
    a = v.allocation_info
    off = a.memory_offset_low + (a.memory_offset_high << 32)
    return a.memory_id, off, off + int(np.prod(v.sizes)) * np.dtype(S.numpy_dtype(v.scalar_type)).itemsize


def _overlap(r, s):
    return r[0] == s[0] and r[1] < s[2] and s[1] < r[2]


def delegate_memory_report(pte: bytes) -> dict[str, int]:
    """Counts, read from the program alone: delegate calls, output/input pairs of one call sharing planned
    bytes, and pairs of planned tensors anywhere sharing bytes (memory reuse: the check is not vacuous)."""
    report = {"calls": 0, "output_input_overlaps": 0, "reused_pairs": 0}
    for plan in load_pte(pte).program.execution_plan:
        vals = plan.values
        ranges = [r for i in range(len(vals)) if (r := _planned(vals, i)) is not None and r[2] > r[1]]
        report["reused_pairs"] += sum(_overlap(r, s) for k, r in enumerate(ranges) for s in ranges[k + 1:])
        defined = set(plan.inputs) | {i for i, ev in enumerate(vals)
                                      if type(ev.val) is S.Tensor and ev.val.data_buffer_idx}
        for chain in plan.chains:
            for instr in chain.instructions:
                a = instr.instr_args
                if type(a) is S.DelegateCall:
                    args = list(a.args)
                    n = 0  # outputs: the trailing tensors nothing defined before the call
                    for idx in reversed(args):
                        if idx in defined or type(vals[idx].val) is not S.Tensor:
                            break
                        n += 1
                    ins, outs = args[:len(args) - n], args[len(args) - n:]
                    assert outs, "a delegate call without outputs"
                    report["calls"] += 1
                    for o in outs:
                        for i in ins:
                            ro, ri = _planned(vals, o), _planned(vals, i)
                            if ro and ri and _overlap(ro, ri):
                                report["output_input_overlaps"] += 1
                    defined.update(args)
                elif type(a) is S.KernelCall:
                    defined.update(a.args)
                elif type(a) is S.MoveCall:
                    defined.add(a.move_to)
    return report


def _models():
    nn = torch.nn

    class Zigzag(nn.Module):
        """Delegable linears between ops the backends leave to portable kernels: one partition each."""

        def __init__(self):
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

        def forward(self, x):
            for i, lin in enumerate(self.lin):
                x = lin(x)
                x = torch.cumsum(x, -1) if i % 2 == 0 else torch.flip(x, [-1])
            return x

    class TwoByTwo(nn.Module):
        """Partitions with two inputs and two outputs."""

        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, y):
            p, q = torch.relu(self.a(x)), self.b(y) + x
            p, q = torch.cumsum(p, -1), torch.flip(q, [0])
            r = self.c(p) + q
            return torch.flip(r, [0]), p * 2 + r

    torch.manual_seed(0)
    return {"zigzag": (Zigzag().eval(), (torch.randn(4, 16),)),
            "two_by_two": (TwoByTwo().eval(), (torch.randn(4, 8), torch.randn(4, 8)))}


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("name", ["zigzag", "two_by_two"])
def test_edgeport_programs_never_plan_an_output_over_an_input(models, name, monkeypatch):
    import edgeport
    from edgeport_example import ExampleExecutor, ExamplePartitioner

    model, inputs = models[name]
    ep = torch.export.export(model, inputs)
    pte = edgeport.to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()]).to_executorch().buffer
    report = delegate_memory_report(pte)
    assert report["calls"] >= 3 and report["reused_pairs"] > 0
    assert report["output_input_overlaps"] == 0

    # run it with ExampleBackend's executor taking out=: every output is written in place, results match eager
    given: list = []
    plain = ExampleExecutor.execute

    def execute(self, handle, inputs, out=None):
        res = plain(self, handle, inputs)
        given.append(out)
        for k, o in enumerate(out):
            if o is not None:
                np.copyto(o, res[k])
                res[k] = o
        return res

    monkeypatch.setattr(ExampleExecutor, "execute", execute)
    method = Runtime.get().load_program(pte).load_method()
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for _ in range(2):
        got = method.execute([t.numpy() for t in inputs])
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-5)
    assert len(given) == 2 * report["calls"]
    assert all(o is not None for outs in given for o in outs)


@pytest.mark.executorch
@pytest.mark.parametrize("name", ["zigzag", "two_by_two", "encoder_layer"])
def test_executorch_programs_never_plan_an_output_over_an_input(zoo, models, name):
    pytest.importorskip("executorch")

    def build():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        model, inputs = models[name] if name in models else zoo.make_model(name)
        lowered = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
        return {"pte": zoo.pte_array(lowered.to_executorch().buffer)}

    pte = zoo.cached_arrays(f"delegate_memory_{name}", build)["pte"].tobytes()
    report = delegate_memory_report(pte)
    assert report["calls"] >= 2 and report["reused_pairs"] > 0
    assert report["output_input_overlaps"] == 0
