"""Long-running fuzz loop for the .pte reader (not collected by pytest).

    python core/tests/program/fuzz_reader.py --seconds 300 --seed 1

Mutates valid programs (random structure, several serializer options) with bit flips, interesting values at
random positions, truncation, insertion/deletion, splicing and header rewrites, then loads each result and uses
every accessor plus ``verify_program``. Anything other than ``ProgramError``, or any input taking longer than
``--slow`` seconds, is reported with the seed to reproduce it and written to ``--crash-dir``.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import random_program  # noqa: E402
from edgeport.errors import ProgramError  # noqa: E402
from edgeport.program import load_pte, serialize_pte, verify_program  # noqa: E402
from edgeport.program import schema as S  # noqa: E402

_INTERESTING32 = [0, 1, 4, 8, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def exercise(data: bytes) -> bool:
    """Load and use ``data``; True if load_pte accepted it, False on ProgramError; anything else propagates."""
    try:
        lp = load_pte(data)
    except ProgramError:
        return False
    try:
        for pi, plan in enumerate(lp.program.execution_plan):
            for di in range(len(plan.delegates)):
                lp.delegate_data(pi, di)
            for v in plan.values:
                if isinstance(v.val, S.Tensor) and v.val.data_buffer_idx:
                    lp.tensor_data(v.val)
        for i in range(lp.num_constants):
            lp.constant(i)
        for nd in lp.program.named_data or []:
            lp.named_data(nd.key)
        verify_program(lp.program)
    except ProgramError:
        pass
    return True


def corpus(rng: random.Random, size: int) -> list[bytes]:
    files = []
    for _ in range(size):
        p = random_program(rng.randrange(1 << 30), max_values=rng.choice([5, 30, 200]))
        files.append(serialize_pte(
            p, segment_alignment=rng.choice([1, 16, 128, 4096]),
            constant_tensor_alignment=rng.choice([None, 1, 64]),
            extract_constant_segment=rng.random() < 0.8, extract_delegate_segments=rng.random() < 0.8,
            named_data={"k": rng.randbytes(rng.randint(0, 40))} if rng.random() < 0.3 else None))
    return files


def mutate(rng: random.Random, data: bytes, files: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 8])):
        op = rng.randrange(8)
        if not buf:
            break
        pos = rng.randrange(len(buf))
        if op == 0:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos] = rng.randrange(256)
        elif op == 2 and pos + 4 <= len(buf):
            struct.pack_into("<I", buf, pos, rng.choice(_INTERESTING32 + [len(buf), len(buf) - pos]))
        elif op == 3:
            del buf[pos:]
        elif op == 4:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 5:
            del buf[pos:pos + rng.randint(1, 16)]
        elif op == 6:
            other = rng.choice(files)
            cut = rng.randrange(len(other))
            buf[pos:] = other[cut:]
        elif op == 7 and len(buf) >= 40:
            field = rng.choice([12, 16, 24, 32])
            size = 4 if field == 12 else 8
            value = rng.choice([0, 1, 24, 31, 32, len(buf), len(buf) + 1, (1 << (8 * size)) - 1])
            buf[field:field + size] = value.to_bytes(size, "little")
    return bytes(buf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--slow", type=float, default=1.0, help="report inputs taking longer than this (s)")
    ap.add_argument("--crash-dir", default="fuzz-crashes")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    files = corpus(rng, 40)
    for f in files:
        assert exercise(f), "a valid program was rejected"
    deadline = time.monotonic() + args.seconds
    runs = accepted = failures = 0
    slowest = 0.0
    while time.monotonic() < deadline:
        case_seed = rng.randrange(1 << 62)
        case_rng = random.Random(case_seed)
        data = mutate(case_rng, case_rng.choice(files), files)
        t0 = time.perf_counter()
        try:
            accepted += exercise(data)
        except Exception:  # noqa: BLE001 - the point of fuzzing
            failures += 1
            os.makedirs(args.crash_dir, exist_ok=True)
            path = os.path.join(args.crash_dir, f"crash-{args.seed}-{case_seed}.pte")
            with open(path, "wb") as f:
                f.write(data)
            print(f"FAIL (seed {args.seed}, case {case_seed}) -> {path}\n{traceback.format_exc()}", flush=True)
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, elapsed)
        if elapsed > args.slow:
            print(f"SLOW {elapsed:.2f}s (seed {args.seed}, case {case_seed}, {len(data)} bytes)", flush=True)
        runs += 1
    print(f"seed {args.seed}: {runs} inputs, {accepted} loaded, {runs - accepted - failures} rejected by load_pte "
          f"with ProgramError, {failures} failures, slowest {slowest * 1e3:.1f} ms")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
