"""Programs built by hand with our schema, serialized by us, executed by the stock ExecuTorch runtime."""

from __future__ import annotations

import numpy as np
import pytest

from edgeport.program import (
    AllocationDetails,
    Buffer,
    Chain,
    Double,
    EValue,
    ExecutionPlan,
    Instruction,
    Int,
    KernelCall,
    Operator,
    Program,
    ScalarType,
    Tensor,
    load_pte,
    serialize_pte,
    verify_program,
    write_pte_file,
)

pytestmark = pytest.mark.executorch
torch = pytest.importorskip("torch")
pytest.importorskip("executorch")


def _tensor(sizes, *, offset=None, const=0, dtype=ScalarType.FLOAT) -> EValue:
    """A contiguous tensor value: planned in arena 1 at ``offset``, or constant ``const``, or unplanned."""
    return EValue(Tensor(dtype, sizes=list(sizes), dim_order=list(range(len(sizes))), data_buffer_idx=const,
                         allocation_info=None if offset is None else AllocationDetails.at(1, offset)))


def _add_program(planned_inputs: bool = True) -> Program:
    """forward(x, y) = aten::add.out(x, y, alpha=1, out=out) on 2x3 float tensors, one 96-byte arena."""
    values = [
        _tensor((2, 3), offset=0 if planned_inputs else None),
        _tensor((2, 3), offset=32 if planned_inputs else None),
        EValue(Int(1)),  # alpha
        _tensor((2, 3), offset=64),  # out
    ]
    plan = ExecutionPlan(
        name="forward", values=values, inputs=[0, 1], outputs=[3],
        chains=[Chain(inputs=[0, 1], outputs=[3], instructions=[Instruction(KernelCall(0, [0, 1, 2, 3, 3]))])],
        operators=[Operator("aten::add", "out")], non_const_buffer_sizes=[0, 96])
    return Program(execution_plan=[plan], constant_buffer=[Buffer(b"")])


def _constant_program(c: np.ndarray, w: np.ndarray) -> Program:
    """forward(x) = (x + c) * w - 0.25*x via add.out, mul.out, sub.out; c and w come from the constant segment."""
    n = c.size * 4
    values = [
        _tensor(c.shape, offset=0),           # 0 x
        _tensor(c.shape, const=1),            # 1 c
        _tensor(w.shape, const=2),            # 2 w
        EValue(Int(1)),                       # 3 alpha for add
        _tensor(c.shape, offset=n),           # 4 x + c
        _tensor(c.shape, offset=2 * n),       # 5 (x + c) * w
        EValue(Double(0.25)),                 # 6 alpha for sub
        _tensor(c.shape, offset=3 * n),       # 7 result
    ]
    instrs = [
        Instruction(KernelCall(0, [0, 1, 3, 4, 4])),   # add.out(self, other, alpha, out) -> out
        Instruction(KernelCall(1, [4, 2, 5, 5])),      # mul.out(self, other, out) -> out
        Instruction(KernelCall(2, [5, 0, 6, 7, 7])),   # sub.out(self, other, alpha, out) -> out
    ]
    plan = ExecutionPlan(
        name="forward", values=values, inputs=[0], outputs=[7], chains=[Chain(instructions=instrs)],
        operators=[Operator("aten::add", "out"), Operator("aten::mul", "out"), Operator("aten::sub", "out")],
        non_const_buffer_sizes=[0, 4 * n])
    return Program(execution_plan=[plan], constant_buffer=[Buffer(b""), Buffer(c.tobytes()), Buffer(w.tobytes())])


def _run(data, *inputs):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(data)
    return program.load_method("forward").execute(list(inputs))


@pytest.mark.parametrize("planned_inputs", [True, False])
def test_hand_built_add_runs_in_executorch(planned_inputs):
    p = _add_program(planned_inputs)
    verify_program(p)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (out,) = _run(serialize_pte(p), x, y)
    torch.testing.assert_close(out, x + y)


@pytest.mark.parametrize("seg_align,tensor_align", [(128, None), (4096, 64), (16, 16), (256, 128)])
def test_constant_segment_program_runs_in_executorch(tmp_path, seg_align, tensor_align):
    rng = np.random.default_rng(0)
    c = rng.standard_normal((3, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    p = _constant_program(c, w)
    data = serialize_pte(p, segment_alignment=seg_align, constant_tensor_alignment=tensor_align)
    lp = load_pte(data)
    assert lp.header is not None and lp.program.constant_buffer == []
    assert bytes(lp.tensor_data(lp.program.execution_plan[0].values[1].val)) == c.tobytes()
    path = tmp_path / "const.pte"
    write_pte_file(path, data)
    x = torch.randn(3, 5)
    (out,) = _run(path, x)
    ct, wt = torch.from_numpy(c), torch.from_numpy(w)
    torch.testing.assert_close(out, (x + ct) * wt - 0.25 * x)


def test_inline_constants_are_refused_by_the_runtime_but_readable_by_us():
    """ExecuTorch 1.5.1 builds drop the legacy inline constant path; our reader still reads such files."""
    rng = np.random.default_rng(1)
    c = rng.standard_normal((2, 2)).astype(np.float32)
    data = serialize_pte(_constant_program(c, c), extract_constant_segment=False)
    lp = load_pte(data)
    assert bytes(lp.tensor_data(lp.program.execution_plan[0].values[2].val)) == c.tobytes()
    with pytest.raises(RuntimeError):
        _run(data, torch.randn(2, 2))
