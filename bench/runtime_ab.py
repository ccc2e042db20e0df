"""In-process A/B of edgeport's runtime: the same ``.pte`` loaded twice in one process, once with the working
tree's runtime and once with the whole runtime package of a base commit (``core/src/edgeport/runtime`` taken from
git into a temporary package: its loader, load-time rewrites, compiler, interpreter loop and portable kernels),
calls of the two loads alternated in blocks. Outputs are compared bit for bit first.

    python bench/runtime_ab.py --base b1213fe [--models llama bert vit t5_encoder] [--decode fp32 8da4w]

Small Hugging Face configs (``edgeport.testing.architectures``, lowered with the XNNPACK partitioner): median and
minimum microseconds per ``execute``. ``--decode``: the medium Llama-style decoder of ``bench/llm_profile.py``
(``--pte-dir`` reuses its files): whole decode steps (``execute``) alternated between the two loads, and every op
of a step timed in place in a second pass: the time of the operations outside the delegates (portable kernels,
moves, list resolvers) per step. CPU model and load average printed; one XNNPACK thread. The delegates' code
(backends) is shared by both loads.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from xnnpack_bench.machine import cpu_model  # noqa: E402

BASE_PKG = "edgeport_runtime_base"
OPTS = {"XnnpackBackend": {"num_threads": 1}}


def base_package(commit: str, root: Path) -> Any:
    """The base commit's ``edgeport.runtime`` as package ``BASE_PKG`` under ``root``."""
    pkg = root / BASE_PKG
    src = "core/src/edgeport/runtime/"
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", commit, src],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{name}"], capture_output=True,
                              text=True, check=True).stdout
        dst = pkg / name[len(src):]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text.replace("edgeport.runtime", BASE_PKG))
    sys.path.insert(0, str(root))
    return importlib.import_module(BASE_PKG)


def load(pte: bytes, base: Any | None) -> Any:
    """The method, on the working tree's runtime, or with ``base`` on the base package's runtime and kernels."""
    from edgeport.registry import KernelRegistry, kernel_registry

    if base is None:
        from edgeport.runtime import Runtime

        return Runtime.get().load_program(pte).load_method("forward", backend_options=OPTS)
    portable = importlib.import_module(f"{BASE_PKG}.portable")
    current = kernel_registry()
    reg = KernelRegistry()
    for op in current.ops():
        e = current.get(op)
        fn = portable.KERNELS.get(op, e.fn) if e.library == "portable" else e.fn
        reg.add(op, fn, e.library)
    return base.Runtime(kernels=reg).load_program(pte).load_method("forward", backend_options=OPTS)


def small(name: str, base: Any, rounds: int, block: int) -> str:
    import torch

    sys.path.insert(0, str(BENCH_DIR))
    from runtime_peer import build, lower

    model, inputs = build(name, "small")
    pte = lower(model, inputs)
    xs = [t.numpy() for t in inputs]
    ms = {"new": load(pte, None), "base": load(pte, base)}
    same = np.array_equal(ms["new"].execute(xs)[0], ms["base"].execute(xs)[0])
    times: dict[str, list[float]] = {k: [] for k in ms}
    with torch.no_grad():
        for r in range(rounds):
            for k in (("new", "base") if r % 2 == 0 else ("base", "new")):
                time.sleep(0.01)
                m = ms[k]
                for _ in range(3):
                    m.execute(xs)
                for _ in range(block):
                    t = time.perf_counter()
                    m.execute(xs)
                    times[k].append(time.perf_counter() - t)
    a, b = (statistics.median(times[k]) * 1e6 for k in ("new", "base"))
    return (f"| {name} (small) | {a:.1f} | {b:.1f} | {a / b:.2f}x | {min(times['new']) * 1e6:.1f} / "
            f"{min(times['base']) * 1e6:.1f} | {same} |")


def decode(scheme: str, base: Any, pte_dir: Path, steps: int) -> str:
    from llm_profile import build

    pte = build(scheme, pte_dir).read_bytes()
    ms = {"new": load(pte, None), "base": load(pte, base)}
    prompt = np.random.default_rng(0).integers(3, 4096, size=32).astype(np.int64)
    prefill = [prompt.reshape(1, -1), np.arange(32, dtype=np.int64)]
    logits = {}
    for k, m in ms.items():
        m.execute(prefill)
        logits[k] = [m.execute([np.array([[7 + i]], dtype=np.int64), np.array([32 + i], dtype=np.int64)])[0]
                     for i in range(8)]
    same = all(np.array_equal(x, y) for x, y in zip(logits["new"], logits["base"]))
    pos = dict.fromkeys(ms, 128)
    step: dict[str, list[float]] = {k: [] for k in ms}
    for i in range(steps):  # whole steps
        for k in (("new", "base") if i % 2 == 0 else ("base", "new")):
            m = ms[k]
            if pos[k] >= 120:  # a fresh prefill before the context fills
                m.execute(prefill)
                pos[k] = 32
            xs = [np.array([[7]], dtype=np.int64), np.array([pos[k]], dtype=np.int64)]
            t = time.perf_counter()
            m.execute(xs)
            step[k].append(time.perf_counter() - t)
            pos[k] += 1
    kern: dict[str, list[float]] = {k: [] for k in ms}
    nops = {}
    for i in range(steps):  # every op timed in place
        for k in (("new", "base") if i % 2 == 0 else ("base", "new")):
            m = ms[k]
            if pos[k] >= 120:
                m.execute(prefill)
                pos[k] = 32
            runner = m._runner
            plan, vals = runner.plan, runner._pool[-1].vals
            for bind, x in zip(plan.binders, [np.array([[7]], dtype=np.int64), np.array([pos[k]], dtype=np.int64)]):
                bind(vals, x)
            pos[k] += 1
            spent, n = 0.0, 0
            with np.errstate(all="ignore"):
                for ops, _jump, labels in plan.chains:
                    for (fn, get, post), label in zip(ops, labels):
                        t = time.perf_counter()
                        r = fn(*get(vals))
                        if post is not None:
                            post(vals, r)
                        if "(delegate" not in label:
                            spent += time.perf_counter() - t
                            n += 1
            for j in plan.borrowed:
                vals[j] = None
            kern[k].append(spent)
            nops[k] = n
    a, b = (statistics.median(kern[k]) * 1e6 for k in ("new", "base"))
    sa, sb = (statistics.median(step[k]) * 1e3 for k in ("new", "base"))
    return (f"| decode {scheme} | {sa:.3f} | {sb:.3f} | {sa / sb:.2f}x | {nops['new']} / {nops['base']} | {a:.0f} | "
            f"{b:.0f} | {a / b:.2f}x | {same} |")


def _reshape_only_stand_in(self: Any, handle: Any) -> bool:
    if callable(getattr(handle, "reshape_only", None)):  # edgeport-xnnpack's own answer (fa741b6)
        return handle.reshape_only() is True
    steps = getattr(handle, "steps", [])
    return len(handle.inputs) == 1 and len(handle.outputs) == 1 and len(steps) == 1 \
        and steps[0].label == "host[1 nodes: StaticReshape]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit whose runtime the base load takes")
    ap.add_argument("--models", nargs="*", default=["llama", "bert", "vit", "t5_encoder"])
    ap.add_argument("--decode", nargs="*", default=[], help="fp32 / 8da4w decode steps of bench/llm_profile.py's model")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pte-dir", default="/tmp/edgeport-llm-profile")
    ap.add_argument("--reshape-only-stand-in", action="store_true",
                    help="give XnnpackExecutor a reshape_only(handle) answering from its planned steps (one host "
                         "step of one StaticReshape node), for executors that do not declare it yet")
    args = ap.parse_args()
    if args.reshape_only_stand_in:
        from edgeport_xnnpack.runtime import XnnpackExecutor

        if not hasattr(XnnpackExecutor, "reshape_only"):
            XnnpackExecutor.reshape_only = _reshape_only_stand_in  # type: ignore[attr-defined]
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; base {args.base}; load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; 1 XNNPACK thread")
    with tempfile.TemporaryDirectory(prefix="edgeport-ab-") as tmp:
        base = base_package(args.base, Path(tmp))
        if args.models:
            print("\n| model | new us | base us | new / base | min new / base | bit-identical |")
            print("|---|---:|---:|---:|---:|---|")
            for name in args.models:
                print(small(name, base, args.rounds, args.block), flush=True)
        if args.decode:
            Path(args.pte_dir).mkdir(parents=True, exist_ok=True)
            print("\n| decode step | step ms new | base | new / base | non-delegate ops new / base | their us new "
                  "| base | new / base | bit-identical |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
            for scheme in args.decode:
                print(decode(scheme, base, Path(args.pte_dir), args.steps), flush=True)
    print(f"\nload average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
