"""Defective programs raise ``ProgramError`` (or another deliberate edgeport error) saying what and where --
never a crash, a hang, or a raw IndexError/struct.error."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgeport.errors import EdgeportError, ProgramError, RuntimeExecutionError
from edgeport.program import schema as S
from edgeport.program.pte import serialize_pte
from edgeport.runtime import Runtime


def _load(data):
    return Runtime.get().load_program(data).load_method()


def _linear(builder):
    rng = np.random.default_rng(0)
    return builder.linear_relu(rng.standard_normal((5, 3)).astype(np.float32),
                               rng.standard_normal(5).astype(np.float32))


def test_truncated_files(builder):
    data = _linear(builder).serialize()
    for cut in sorted({0, 3, 7, 8, 16, 40, len(data) // 3, len(data) // 2, len(data) - 200, len(data) - 1}):
        with pytest.raises(ProgramError):
            _load(data[:cut])


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.pte").write_bytes(b"")
    with pytest.raises(ProgramError):
        Runtime.get().load_program(tmp_path / "empty.pte")
    with pytest.raises(ProgramError, match="cannot read"):
        Runtime.get().load_program(tmp_path / "nope.pte")


def test_random_corruption_only_raises_edgeport_errors(builder):
    """Flip bytes at random: loading and running either works or raises a deliberate edgeport error."""
    data = bytearray(_linear(builder).serialize())
    rng = random.Random(1234)
    x = np.ones((2, 3), np.float32)
    outcomes = {"load": 0, "run": 0, "ok": 0}
    for _ in range(400):
        bad = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 4])):
            pos = rng.randrange(len(bad))
            bad[pos] = rng.randrange(256)
        try:
            method = _load(bytes(bad))
        except EdgeportError:
            outcomes["load"] += 1
            continue
        try:
            method.execute([x])
            outcomes["ok"] += 1
        except EdgeportError:
            outcomes["run"] += 1
    assert outcomes["load"] > 0 and sum(outcomes.values()) == 400


def _plan_defect(builder, mutate):
    pb = _linear(builder)
    program = pb.program()
    mutate(program.execution_plan[0])
    return serialize_pte(program)


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p.chains[0].instructions[1].instr_args.args.__setitem__(1, 999), r"value index 999 out of range"),
    (lambda p: setattr(p.chains[0].instructions[0].instr_args, "op_index", 7), r"op_index 7 out of range"),
    (lambda p: p.non_const_buffer_sizes.__setitem__(1, 8), r"runs past arena 1"),
    (lambda p: setattr(p.values[p.inputs[0]].val.allocation_info, "memory_offset_low", 2), r"not aligned"),
    (lambda p: setattr(p.values[p.inputs[0]].val.allocation_info, "memory_id", 3), r"memory_id 3 out of range"),
    (lambda p: setattr(p.values[p.inputs[0]].val, "dim_order", [0, 0]), r"dim_order"),
    (lambda p: setattr(p.values[p.inputs[0]].val, "scalar_type", S.ScalarType.BFLOAT16), r"bfloat16"),
    (lambda p: setattr(p.values[p.inputs[0]].val, "scalar_type", 99), r"scalar_type"),
    (lambda p: p.chains[0].instructions[2].instr_args.args.__delitem__(slice(1, None)),
     r"1 arguments, but its kernel takes 2"),
    (lambda p: p.chains[0].instructions[2].instr_args.args.extend([0, 0]), r"returns at most one value"),
    (lambda p: p.chains[0].instructions[2].instr_args.args.__setitem__(1, 1), r"writes into constant"),
    (lambda p: p.inputs.__setitem__(0, 1), r"constant tensor"),
    (lambda p: p.chains[0].instructions.append(S.Instruction(S.JumpFalseCall(0, 99))), r"destination"),
    (lambda p: p.outputs.append(12345), r"out of range"),
    (lambda p: p.chains[0].instructions.append(S.Instruction(S.DelegateCall(0, [0]))), r"delegate_index 0"),
])
def test_semantic_defects(builder, mutate, match):
    data = _plan_defect(builder, mutate)
    with pytest.raises(ProgramError, match=match):
        _load(data)


def test_constant_data_out_of_range(builder):
    pb = _linear(builder)
    program = pb.program()
    program.execution_plan[0].values[1].val.data_buffer_idx = 40
    with pytest.raises(ProgramError, match="data_buffer_idx 40"):
        _load(serialize_pte(program))


def test_kernel_failure_names_the_instruction(builder):
    pb = builder.ProgramBuilder()
    x, y = pb.tensor((4,)), pb.tensor((2, 3))
    pb.op("aten::view_copy", "out", [x, pb.int_list([2, 3]), y, y])
    pb.inputs, pb.outputs = [x], [y]
    method = _load(pb.serialize())
    with pytest.raises(RuntimeExecutionError, match=r"instructions\[0\] \(aten::view_copy.out\).*invalid"):
        method.execute([np.zeros(4, np.float32)])


def test_endless_loop_is_stopped(builder, monkeypatch):
    import edgeport.runtime._execute as m

    monkeypatch.setattr(m, "MAX_STEPS", 1000)
    pb = builder.ProgramBuilder()
    x, y = pb.tensor((2,)), pb.tensor((2,))
    never = pb.add(S.Bool(False))
    pb.op("aten::relu", "out", [x, y, y])
    pb.instructions.append(S.Instruction(S.JumpFalseCall(never, 0)))
    pb.inputs, pb.outputs = [x], [y]
    method = _load(pb.serialize())
    with pytest.raises(RuntimeExecutionError, match="endless loop"):
        method.execute([np.zeros(2, np.float32)])


def test_jump_false_loop_counts(builder):
    """A loop written with prim ops and JumpFalseCall (the shape ExecuTorch emits for torch.map)."""
    pb = builder.ProgramBuilder()
    x = pb.tensor((3,))
    acc = pb.tensor((3,))
    i, one, n, done = pb.int(0), pb.int(1), pb.int(4), pb.add(S.Bool(False))
    alpha = pb.int(1)
    pb.op("aten::clone", "out", [x, pb.add(S.Null()), acc, acc])
    pb.op("aten::add", "out", [acc, x, alpha, acc, acc])  # instruction 1: loop body
    pb.op("executorch_prim::add", "Scalar", [i, one, i])
    pb.op("executorch_prim::eq", "Scalar", [i, n, done])
    pb.instructions.append(S.Instruction(S.JumpFalseCall(done, 1)))
    pb.op("executorch_prim::sub", "Scalar", [i, n, i])  # reset for the next run
    pb.inputs, pb.outputs = [x], [acc]
    method = _load(pb.serialize())
    for _ in range(2):
        (y,) = method.execute([np.array([1, 2, 3], np.float32)])
        np.testing.assert_array_equal(y, [5, 10, 15])
