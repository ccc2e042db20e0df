"""Per-instruction overhead of edgeport's runtime on a 1000-op elementwise chain (goal: <= 5 us/instruction).

The program is built directly from the schema (no torch): ``x -> add(., c) -> mul(., c) -> relu -> ...`` on a
small tensor, ping-ponging between two planned buffers, so the time is dominated by dispatch, not arithmetic.
Reports the median over repetitions of: the full run with the portable kernels, and the interpreter alone (the
same program with no-op kernels), both divided by the instruction count.

    python bench/runtime_overhead.py [--ops 1000] [--size 16] [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgeport.program import schema as S
from edgeport.program.pte import serialize_pte
from edgeport.registry import KernelRegistry, kernel_registry
from edgeport.runtime import Runtime


def chain_program(n_ops: int, size: int) -> bytes:
    values: list[S.EValue] = []

    def add(v) -> int:
        values.append(S.EValue(v))
        return len(values) - 1

    nbytes = (size * 4 + 15) // 16 * 16

    def tensor(slot: int) -> int:
        return add(S.Tensor(scalar_type=S.ScalarType.FLOAT, sizes=[size], dim_order=[0],
                            allocation_info=S.AllocationDetails.at(1, slot * nbytes)))

    c = np.linspace(0.25, 0.75, size, dtype=np.float32)
    const = add(S.Tensor(scalar_type=S.ScalarType.FLOAT, sizes=[size], dim_order=[0], data_buffer_idx=1))
    alpha = add(S.Int(1))
    x = tensor(0)
    ops = [S.Operator("aten::add", "out"), S.Operator("aten::mul", "out"), S.Operator("aten::relu", "out")]
    instrs = []
    cur = x
    for i in range(n_ops):
        out = tensor(1 + i % 2)
        kind = i % 3
        if kind == 0:
            args = [cur, const, alpha, out, out]
        elif kind == 1:
            args = [cur, const, out, out]
        else:
            args = [cur, out, out]
        instrs.append(S.Instruction(S.KernelCall(kind, args)))
        cur = out
    plan = S.ExecutionPlan(name="forward", values=values, inputs=[x], outputs=[cur],
                           chains=[S.Chain(inputs=[x], outputs=[cur], instructions=instrs)], operators=ops,
                           non_const_buffer_sizes=[0, 3 * nbytes])
    return serialize_pte(S.Program(execution_plan=[plan], constant_buffer=[S.Buffer(b""), S.Buffer(c.tobytes())]))


def _noop_registry() -> KernelRegistry:
    reg = KernelRegistry()

    def k2(a, out):
        return out

    def k3(a, b, out):
        return out

    def k4(a, b, alpha, out):
        return out

    reg.add("aten::add.out", k4, "noop")
    reg.add("aten::mul.out", k3, "noop")
    reg.add("aten::relu.out", k2, "noop")
    return reg


def measure(method, x, reps: int) -> float:
    method.execute([x])
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        method.execute([x])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    data = chain_program(args.ops, args.size)
    x = np.random.default_rng(0).standard_normal(args.size).astype(np.float32)
    full = Runtime(kernel_registry()).load_program(data).load_method()
    bare = Runtime(_noop_registry()).load_program(data).load_method()
    # correctness of the chain against numpy
    c = np.linspace(0.25, 0.75, args.size, dtype=np.float32)
    ref = x.copy()
    for i in range(args.ops):
        ref = ref + c if i % 3 == 0 else (ref * c if i % 3 == 1 else np.maximum(ref, 0))
    np.testing.assert_allclose(full.execute([x])[0], ref, rtol=1e-4)
    t_full = measure(full, x, args.reps)
    t_bare = measure(bare, x, args.reps)
    n = args.ops
    print(f"| runtime overhead ({n}-op elementwise chain, {args.size} floats) | per run | per instruction |")
    print("|---|---|---|")
    print(f"| portable kernels (dispatch + numpy ufunc) | {t_full * 1e3:.2f} ms | {t_full / n * 1e6:.2f} us |")
    print(f"| interpreter only (no-op kernels) | {t_bare * 1e3:.2f} ms | {t_bare / n * 1e6:.2f} us |")
    print(f"\ngoal: <= 5 us per instruction -> {'met' if t_full / n <= 5e-6 else 'NOT met'}")


if __name__ == "__main__":
    main()
