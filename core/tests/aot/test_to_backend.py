"""to_backend rewrites: graph order after replacement, shared constants, outputs used in between."""

from __future__ import annotations

import torch

from edgeport import to_backend, to_edge
from edgeport.aot.delegate_op import CALL_DELEGATE


def test_outside_user_between_partition_nodes_is_reordered(demo_partitioner):
    # mm and add form one partition; sin uses mm's result and sits between them in graph order.
    class M(torch.nn.Module):
        def forward(self, a, b, c):
            y = torch.mm(a, b)
            z = torch.sin(y)
            w = y + c
            return z, w

    inputs = (torch.randn(3, 3), torch.randn(3, 3), torch.randn(3, 3))
    edge = to_edge(torch.export.export(M(), inputs))
    delegated = to_backend(edge.exported_program(), demo_partitioner())
    delegated.graph.lint()
    assert len([n for n in delegated.graph.nodes if n.target is CALL_DELEGATE]) == 1
    for got, want in zip(delegated.module()(*inputs), M()(*inputs)):
        torch.testing.assert_close(got, want)


def test_constant_shared_by_delegate_and_portable_code_stays_available(demo_partitioner):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))

        def forward(self, a):
            return torch.mm(a, self.w) + self.w, torch.sin(self.w)

    inputs = (torch.randn(3, 3),)
    model = M()
    edge = to_edge(torch.export.export(model, inputs))
    delegated = to_backend(edge.exported_program(), demo_partitioner())
    with torch.no_grad():
        for got, want in zip(delegated.module()(*inputs), model(*inputs)):
            torch.testing.assert_close(got, want)
    # The shared weight stays a program constant and is passed to the delegate as an input.
    assert len(delegated.state_dict) == 1
    program = to_edge(torch.export.export(model, inputs)).to_backend(demo_partitioner()).to_executorch()
    assert program.buffer[4:8] == b"ET12"


def test_delegate_outputs_live_from_the_delegate_call(demo_partitioner):
    # sin/mul use the delegate's first output and sit between the partition's nodes: after reordering they run
    # between the delegate call and the getitem of its second output. The second output is written by the call,
    # so its memory must not be reused by sin's (dead by then) result.
    class M(torch.nn.Module):
        def forward(self, a, b, c):
            y1 = torch.mm(a, b)
            t = torch.sin(y1) * 2
            y2 = y1 + c
            return t, y2

    inputs = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4))
    program = to_edge(torch.export.export(M(), inputs)).to_backend(demo_partitioner()).to_executorch()
    plan = program.executorch_program.execution_plan[0]
    (call,) = [i.instr_args for i in plan.chains[0].instructions if type(i.instr_args).__name__ == "DelegateCall"]
    delegate_out = {plan.values[i].val.allocation_info.memory_offset_low for i in call.args[-2:]}
    for ins in plan.chains[0].instructions:
        a = ins.instr_args
        if type(a).__name__ == "KernelCall":  # every portable output lives apart from the delegate's outputs
            out = plan.values[a.args[-1]].val
            assert out.allocation_info.memory_offset_low not in delegate_out
