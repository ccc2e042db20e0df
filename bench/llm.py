"""LLM generation: edgeport's flow against ExecuTorch's and eager PyTorch, side by side in one run.

For each size (``medium``: Llama-style, hidden 512 x 4 layers; ``1b``: Llama-3.2-1B's shapes, random weights) and
each scheme (fp32, 8da4w with group 32), the same Hugging Face decoder (``edgeport.testing.decoders``) is exported
once with its static KV cache and lowered by both frameworks with their XNNPACK partitioners. Then, each in its own
child process (so its peak RSS is its own), interleaved over ``--rounds``:

* ``edgeport``: edgeport's program on edgeport's runtime;
* ``et``: ExecuTorch's program on ExecuTorch's runtime (its Python bindings);
* ``edgeport-on-et``: edgeport's program on ExecuTorch's runtime;
* ``eager``: the same static-cache module in eager PyTorch (fp32 and torchao-quantized);
* ``et-tuned``: ExecuTorch's tuned LLM program of the same shapes (its own Llama with its custom ``llama::``
  KV-cache / SDPA ops, ``export_llama`` with XNNPACK, built by ``bench/et_tuned_llama.py``) on ExecuTorch's runtime.
  Its weights are its own random ones, so its tokens are not comparable with the others; its speed is;
* ``edgeport-on-tuned``: that same tuned program on edgeport's runtime (portable ``llama::`` kernels).

Each child prefills a ``--prompt``-token prompt in one call, then greedily decodes ``--new`` tokens; it reports
time to first token, prefill and decode tokens/s (medians over rounds) and its peak RSS. Lowering time and
``.pte`` size come from the parent. All contenders run with ``--threads`` threads (default 1).

**Paired steady decode** (``paired`` column): one more child per round loads ``edgeport``, ``et`` and
``edgeport-on-et`` side by side in one process, prefills each, then decodes with them in turn, one step each,
rotating the order every step; each step's time is divided by the ``et`` step next to it and the column is the
median of those per-step ratios (as a speed ratio). The three then see the same machine at the same moment. This
host's L3 (300 MiB) is shared with other tenants and a decoder's weights (16-62 MiB) may or may not stay in it, so
the rates of children run minutes apart move by up to ~45% between runs; the paired ratio is the steadier of the
two ``vs ET`` figures (each contender there also evicts the others' weights, as any second process would).

The tuned programs take the start position (``input_pos [1]``) instead of one cache position per token, and are
exported with ``max_seq_len = prompt + 1`` (ExecuTorch bounds the token count at ``max_seq_len - 1``); only the
``medium`` size has one.

Usage::

    python bench/llm.py                         # markdown on stdout
    python bench/llm.py --sizes medium,1b --write-report
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from xnnpack_bench.machine import cpu_model, loadavg  # noqa: E402

SECTION_TITLE = "## LLM generation"
CONTENDERS = ("edgeport", "et", "edgeport-on-et", "eager", "et-tuned", "edgeport-on-tuned")
#: contenders of the paired child (one process, one decode step each in turn); the first is the reference
PAIRED = ("et", "edgeport", "edgeport-on-et")
#: contender -> the program it runs, when not its own
PROGRAM_OF = {"edgeport-on-et": "edgeport", "edgeport-on-tuned": "et-tuned"}


def _flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                keep = [f for f in flags if re.match(r"avx|fma|f16c|amx|vnni", f)]
                return " ".join(keep)
    except OSError:
        pass
    return "unknown"


# -- parent: build programs ----------------------------------------------------------------------------------
def build(size: str, scheme: str, context: int, chunk: int, work: Path) -> dict[str, Any]:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from edgeport.llm import export_decoder
    from edgeport.llm.export import _quantize
    from edgeport.testing.decoders import DECODERS

    # each framework gets its own instance built from the same seed (identical weights) instead of deep copies of
    # one: at the 1b size three float32 copies alive at once would take ~15 GB
    quant = None if scheme == "fp32" else scheme
    model = DECODERS["llama"](seed=0, size=size)
    t = time.perf_counter()
    ours = export_decoder(model, max_seq_len=chunk, max_context_len=context, quantize=quant)
    ours_pte = ours.manager.buffer
    ours_s = time.perf_counter() - t
    constant_methods, vocab = ours.metadata.constant_methods(), ours.metadata.vocab_size
    del ours, model
    gc.collect()
    theirs_model = DECODERS["llama"](seed=0, size=size)
    t = time.perf_counter()
    _quantize(theirs_model, quant, None, 32)
    wrapper = TorchExportableModuleForDecoderOnlyLM(theirs_model, batch_size=1, max_cache_len=context)
    seq = torch.export.Dim("seq_len", min=1, max=chunk)
    ep = wrapper.export(input_ids=torch.zeros((1, 4), dtype=torch.long), cache_position=torch.arange(4),
                        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    et_pte = et_lower(ep, partitioner=[EtXnnpack()],
                      constant_methods=constant_methods).to_executorch().buffer
    et_s = time.perf_counter() - t
    del theirs_model, wrapper, ep
    gc.collect()
    paths = {"edgeport": work / f"{size}-{scheme}-edgeport.pte", "et": work / f"{size}-{scheme}-et.pte"}
    paths["edgeport"].write_bytes(ours_pte)
    paths["et"].write_bytes(et_pte)
    eager_path = work / f"{size}-{scheme}-eager.pt"
    torch.save({"size": size, "scheme": scheme}, eager_path)
    built = {"lower_s": {"edgeport": ours_s, "et": et_s}, "pte_bytes": {"edgeport": len(ours_pte), "et": len(et_pte)},
             "paths": {k: str(v) for k, v in paths.items()}, "vocab": vocab}
    from et_tuned_llama import SIZES as TUNED_SIZES
    from et_tuned_llama import build_tuned

    if size in TUNED_SIZES:
        t = time.perf_counter()
        tuned = build_tuned(size, scheme, max_seq_len=chunk + 1, max_context_len=context)
        built["lower_s"]["et-tuned"] = time.perf_counter() - t
        built["pte_bytes"]["et-tuned"] = len(tuned.pte)
        path = work / f"{size}-{scheme}-et-tuned.pte"
        path.write_bytes(tuned.pte)
        built["paths"]["et-tuned"] = str(path)
    return built


# -- child: one contender --------------------------------------------------------------------------------------
def _stepper(contender: str, args: argparse.Namespace) -> Any:
    """``step(ids, positions) -> logits`` of one contender, with its ``load_s`` attribute: the seconds from
    reading the program to a method ready to run (imports before that, not counted), including edgeport's
    preparation of the one-token decode step (``Method.prepare``, as ``edgeport.llm.TextRunner`` does)."""
    import numpy as np

    if contender in ("edgeport", "edgeport-on-tuned"):
        import edgeport_xnnpack.runtime  # noqa: F401 - imported here, not inside the timed load

        from edgeport.registry import get_backend
        from edgeport.runtime import Runtime

        get_backend("XnnpackBackend")  # the plugins' entry points load (imports) here, not inside the timed load

        begin = time.perf_counter()
        method = Runtime.get().load_program(args.pte).load_method(
            backend_options={"XnnpackBackend": {"num_threads": args.threads}})
        if contender == "edgeport-on-tuned":  # ExecuTorch's llama export takes the start position
            def step(ids: Any, pos: Any) -> Any:
                return method.execute([ids, pos[:1]])[0]
        else:
            def step(ids: Any, pos: Any) -> Any:
                return method.execute([ids, pos])[0]
        method.prepare([np.zeros((1, 1), np.int64), np.zeros(1, np.int64)])
        step.load_s = time.perf_counter() - begin  # type: ignore[attr-defined]
        return step
    if contender == "et-tuned":
        from et_tuned_llama import et_stepper
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - imported outside the timed load
        from executorch.runtime import Runtime  # noqa: F401

        begin = time.perf_counter()
        tuned = et_stepper(args.pte, args.threads)

        def step(ids: Any, pos: Any) -> Any:
            return tuned(ids, int(pos[0]))
        step.load_s = time.perf_counter() - begin  # type: ignore[attr-defined]
        return step
    if contender in ("et", "edgeport-on-et"):
        import torch
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        if hasattr(portable_lib, "_unsafe_reset_threadpool"):
            portable_lib._unsafe_reset_threadpool(args.threads)
        begin = time.perf_counter()
        loaded = Runtime.get().load_program(args.pte).load_method("forward")

        def step(ids: Any, pos: Any) -> Any:
            return loaded.execute([torch.from_numpy(ids), torch.from_numpy(pos)])[0].numpy()
        step.load_s = time.perf_counter() - begin  # type: ignore[attr-defined]
        return step
    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from edgeport.llm.export import _quantize
    from edgeport.testing.decoders import DECODERS

    torch.set_num_threads(args.threads)
    model = DECODERS["llama"](seed=0, size=args.size)
    _quantize(model, None if args.scheme == "fp32" else args.scheme, None, 32)
    module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=args.context).model

    def eager(ids: Any, pos: Any) -> Any:
        with torch.no_grad():
            return module(input_ids=torch.from_numpy(ids), cache_position=torch.from_numpy(pos)).numpy()

    eager.load_s = float("nan")  # type: ignore[attr-defined]
    return eager


def paired_child(args: argparse.Namespace) -> None:
    """:data:`PAIRED` in one process: prefill each, then one greedy decode step each in turn, the order rotated
    every step; per contender the per-step time ratios ``et / it`` (speed vs ``et``) and its step times."""
    import numpy as np

    paths = {"edgeport": args.pte, "edgeport-on-et": args.pte, "et": args.pte_et}
    steps = {c: _stepper(c, argparse.Namespace(**{**vars(args), "pte": paths[c]})) for c in PAIRED}
    prompt = np.random.default_rng(0).integers(3, args.vocab, size=args.prompt).astype(np.int64)
    tokens: dict[str, list[int]] = {}
    for c, step in steps.items():
        logits = step(prompt.reshape(1, -1), np.arange(args.prompt, dtype=np.int64))
        tokens[c] = [int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))]
    times: dict[str, list[float]] = {c: [] for c in PAIRED}
    for i in range(args.new - 1):
        order = PAIRED[i % 3:] + PAIRED[:i % 3]
        for c in order:
            ids = np.array([[tokens[c][-1]]], dtype=np.int64)
            t = time.perf_counter()
            logits = steps[c](ids, np.array([args.prompt + i], dtype=np.int64))
            times[c].append(time.perf_counter() - t)
            tokens[c].append(int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1])))
    skip = 1  # the first decode call's one-time work (edgeport's specialization) is not steady state
    ratios = {c: [e / x for e, x in zip(times["et"][skip:], times[c][skip:])] for c in PAIRED}
    print(json.dumps({"ratios": ratios, "times": {c: t[skip:] for c, t in times.items()}, "tokens": tokens}))


def child(args: argparse.Namespace) -> None:
    import numpy as np

    step = _stepper(args.contender, args)
    prompt = np.random.default_rng(0).integers(3, args.vocab, size=args.prompt).astype(np.int64)
    results = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        logits = step(prompt.reshape(1, -1), np.arange(args.prompt, dtype=np.int64))
        token = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
        ttft = time.perf_counter() - t0
        tokens = [token]
        steps = []
        t1 = time.perf_counter()
        for i in range(args.new - 1):
            ts = time.perf_counter()
            logits = step(np.array([[token]], dtype=np.int64), np.array([args.prompt + i], dtype=np.int64))
            token = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
            steps.append(time.perf_counter() - ts)
            tokens.append(token)
        decode = time.perf_counter() - t1
        # steady state: the median decode step (a fresh process's first decode call also pays one-time work, e.g.
        # edgeport's runtime specializing its delegates for the one-token shape)
        results.append({"ttft_s": ttft, "prefill_tps": args.prompt / ttft, "decode_tps": (args.new - 1) / decode,
                        "steady_tps": 1.0 / statistics.median(steps) if steps else float("nan"),
                        "first_step_s": steps[0] if steps else float("nan"), "tokens": tokens})
    from edgeport.llm.runner import peak_rss_bytes

    rss = peak_rss_bytes()
    print(json.dumps({"runs": results, "peak_rss": rss, "load_s": step.load_s}))


def run_child(contender: str, size: str, scheme: str, pte: str | None, args: argparse.Namespace,
              vocab: int, pte_et: str = "") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", contender, "--size", size, "--scheme", scheme, "--pte", pte or "",
           "--pte-et", pte_et,
           "--threads", str(args.threads), "--prompt", str(args.prompt), "--new", str(args.new), "--rounds", "1",
           "--context", str(args.context), "--vocab", str(vocab)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr or "")[-800:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="medium")
    ap.add_argument("--schemes", default="fp32,8da4w")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--child", choices=CONTENDERS + ("paired",))
    ap.add_argument("--size", default="medium")
    ap.add_argument("--scheme", default="fp32")
    ap.add_argument("--pte", default="")
    ap.add_argument("--pte-et", default="")
    ap.add_argument("--vocab", type=int, default=0)
    args = ap.parse_args()
    if args.child == "paired":
        paired_child(args)
        return
    if args.child:
        args.contender = args.child
        child(args)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeport-llm-bench-") as tmp:
        for size in args.sizes.split(","):
            for scheme in args.schemes.split(","):
                built = build(size, scheme, args.context, args.prompt, Path(tmp))
                runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
                rss: dict[str, int] = {}
                errors: dict[str, str] = {}
                paired: list[dict[str, Any]] = []
                for _ in range(args.rounds):
                    for contender in CONTENDERS:
                        pte = built["paths"].get(PROGRAM_OF.get(contender, contender))
                        if contender in ("et-tuned", "edgeport-on-tuned") and pte is None:
                            errors[contender] = f"no tuned program of size {size} (bench/et_tuned_llama.py)"
                            continue
                        res = run_child(contender, size, scheme, pte, args, built["vocab"])
                        if "error" in res:
                            errors[contender] = res["error"]
                            continue
                        runs[contender] += [{**r, "load_s": res["load_s"]} for r in res["runs"]]
                        rss[contender] = max(rss.get(contender, 0), res["peak_rss"])
                    res = run_child("paired", size, scheme, built["paths"]["edgeport"], args, built["vocab"],
                                    built["paths"]["et"])
                    if "error" in res:
                        errors["paired"] = res["error"]
                    else:
                        paired.append(res)
                rows.append((size, scheme, built, runs, rss, errors, paired))
                print(f"done {size} {scheme}", file=sys.stderr)
    text = report(rows, args)
    print(text)
    if args.write_report:
        write_report(text)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs) if runs else float("nan")


def _paired(paired: list[dict[str, Any]], contender: str, errors: dict[str, str]) -> str:
    """The paired column of one contender: median per-step speed ratio vs ``et`` [q25-q75], or why not."""
    import numpy as np

    if contender not in PAIRED:
        return "-"
    if not paired:
        return "error" if "paired" in errors else "-"
    ratios = [r for res in paired for r in res["ratios"][contender]]
    q25, q50, q75 = np.quantile(ratios, [0.25, 0.5, 0.75])
    return f"{q50:.2f}x [{q25:.2f}-{q75:.2f}]"


def report(rows: list[Any], args: argparse.Namespace) -> str:
    lines = [SECTION_TITLE, "",
             f"Measured {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC on {cpu_model()} ({os.cpu_count()} cores, "
             f"load average {loadavg()}), flags: {_flags()}; Python {platform.python_version()}; "
             f"{args.threads} thread(s); prompt {args.prompt} tokens in one prefill call, {args.new} new tokens "
             f"greedy, KV cache {args.context}; medians of {args.rounds} rounds, contenders interleaved, each in its "
             "own process. `python bench/llm.py` (see its docstring).", "",
             "`decode tok/s` = the new tokens after the first over the decode loop's wall time (a fresh process: "
             "the first decode call's one-time work included); `steady` = 1 / the median decode step; `1st step "
             "ms` = the first decode call; `load ms` = reading the program to a method ready to run, imports not "
             "counted (edgeport's includes preparing the one-token decode step, `Method.prepare`, as its text "
             "runner does; ExecuTorch's XNNPACK packs its weights there); `paired` = the median per-step speed "
             "ratio against `et` with the three contenders decoding in turn in one process (see the docstring), "
             "over all rounds' steps, with its interquartile range.", "",
             "| size | scheme | contender | decode tok/s | vs ET | steady tok/s | vs ET | paired vs ET | 1st step ms "
             "| load ms | prefill tok/s | TTFT ms | peak RSS MiB | .pte MiB | lowering s | tokens = eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, scheme, built, runs, rss, errors, paired in rows:
        et_decode = _median(runs["et"], "decode_tps")
        et_steady = _median(runs["et"], "steady_tps")
        eager_tokens = runs["eager"][0]["tokens"] if runs["eager"] else None
        for c in CONTENDERS:
            if c in errors and not runs[c]:
                lines.append(f"| {size} | {scheme} | {c} | error: {errors[c].strip().splitlines()[-1][:80]} |"
                             + " |" * 12)
                continue
            decode = _median(runs[c], "decode_tps")
            steady = _median(runs[c], "steady_tps")
            prog = PROGRAM_OF.get(c, c)
            pte = built["pte_bytes"].get(prog)
            lower = built["lower_s"].get(prog)
            same = "-" if eager_tokens is None or c in ("eager", "et-tuned") else (
                "yes" if runs[c][0]["tokens"] == eager_tokens else "no")
            if c == "edgeport-on-tuned":  # its own weights: compared with et-tuned's tokens
                same = "-" if not runs["et-tuned"] else (
                    "= et-tuned" if runs[c][0]["tokens"] == runs["et-tuned"][0]["tokens"] else "no (vs et-tuned)")
            lines.append(
                f"| {size} | {scheme} | {c} | {decode:.1f} | {decode / et_decode:.2f}x | {steady:.1f} | "
                f"{steady / et_steady:.2f}x | {_paired(paired, c, errors)} | "
                f"{_median(runs[c], 'first_step_s') * 1e3:.1f} | {_median(runs[c], 'load_s') * 1e3:.0f} | "
                f"{_median(runs[c], 'prefill_tps'):.0f} | {_median(runs[c], 'ttft_s') * 1e3:.1f} | "
                f"{rss.get(c, 0) / 2**20:.0f} | {'-' if pte is None else f'{pte / 2**20:.1f}'} | "
                f"{'-' if lower is None else f'{lower:.1f}'} | {same} |")
    lines.append("")
    return "\n".join(lines)


def write_report(text: str) -> None:
    path = BENCH_DIR / "REPORT.md"
    old = path.read_text()
    pattern = re.compile(rf"^{re.escape(SECTION_TITLE)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(text + "\n", old) if pattern.search(old) else old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)


if __name__ == "__main__":
    main()
