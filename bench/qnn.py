"""QNN: edgeport-qnn against ONNX Runtime's QNN execution provider, same models, same QNN HTP emulator.

Both sides use the QNN libraries of the one ``onnxruntime-qnn==2.7.0`` wheel (QAIRT 2.51 ``libQnnHtp.so``; on
x86-64 the HTP emulator), fp32, in one process. ORT-QNN: the plugin EP registered with
``register_execution_provider_library``, ``backend_path`` = that ``libQnnHtp.so``, ``htp_arch=75`` (no
``soc_model``: with it the EP runs fp32 graphs in HTP fp16 precision), ``session.disable_cpu_ep_fallback=1`` (every
node on QNN or the session fails). Per model, measured interleaved (the two sides alternate which goes first):

* lowering: edgeport ``torch.export.export`` + ``to_edge_transform_and_lower(partitioner=[QnnPartitioner()])``
  ``.to_executorch()`` (the graph is finalized and serialized as a context binary inside); ORT
  ``torch.onnx.export(dynamo=False, opset 17)`` + ``InferenceSession`` creation (which builds and finalizes the QNN
  graph); median of ``--reps``;
* load: edgeport ``load_program`` + ``load_method`` of the ``.pte`` (the context binary is restored, no graph
  build); ORT: session creation from the EPContext model it dumped (``ep.context_enable=1``, binary in a side file:
  the same restore) -- and, for reference, session creation from the plain ``.onnx`` (what the lowering column
  times without the export); medians of ``--reps``;
* latency: ``Method.execute`` vs ``InferenceSession.run``, median of ``--iters`` after a warm-up;
* context binary size: the QNN context binary in edgeport's blob vs ORT's ``*_qnn.bin``;
* max |difference| of the outputs relative to the eager output's scale.

Usage::

    python bench/qnn.py                 # markdown on stdout
    python bench/qnn.py --write-report  # also rewrite the "## QNN" section of REPORT.md

onnx and onnxruntime are benchmark/test-only dependencies (edgeport never imports them).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "backends-qnn" / "tests"))  # qnn_models
from architectures import write_section  # noqa: E402  (bench/ is not a package)
from lowering import loadavg  # noqa: E402
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## QNN"
MODELS = ("mlp", "cnn", "encoder")


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


class OrtQnn:
    def __init__(self) -> None:
        import onnxruntime as ort
        import onnxruntime_qnn

        self.ort = ort
        ep = onnxruntime_qnn.get_ep_name()
        try:
            ort.register_execution_provider_library(ep, onnxruntime_qnn.get_library_path())
        except Exception as e:  # noqa: BLE001
            if "already registered" not in str(e).lower():
                raise
        self.devices = [d for d in ort.get_ep_devices() if d.ep_name == ep]
        if not self.devices:
            raise RuntimeError("ONNX Runtime's QNN EP reports no device")
        self.options = {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "htp_arch": "75"}

    def session(self, path: str, dump_context: str | None = None) -> Any:
        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if dump_context:
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_embed_mode", "0")
            so.add_session_config_entry("ep.context_file_path", dump_context)
        so.add_provider_for_devices(self.devices, self.options)
        s = self.ort.InferenceSession(path, so)
        assert s.get_providers()[0] == "QNNExecutionProvider"
        return s


def _bare_execute(pte: bytes, feed_np: list[Any]) -> Any:
    """A closure calling QNN's graphExecute directly on the (first) delegate's context binary: buffers bound once."""
    import numpy as np

    from edgeport.program.reader import load_pte
    from edgeport_qnn.blob import unpack_blob
    from edgeport_qnn.runtime import shared_backend

    header, sealed = unpack_blob(bytes(load_pte(pte).delegate_data(0, 0)))
    graph = shared_backend().load_context(bytes(sealed)).graph(header.graph)
    results = [np.empty(s.shape, s.dtype) for s in graph.outputs]
    for buf, array in (*zip(graph._in_bufs, feed_np), *zip(graph._out_bufs, results)):
        buf.data = array.ctypes.data
    fn, args = graph._execute, (graph._handle, graph._ins_ptr, graph._n_in, graph._outs_ptr, graph._n_out, None, None)
    def run(_alive: Any = (graph, results, feed_np)) -> None:  # the default keeps the bound arrays alive
        fn(*args)

    return run


def measure_model(name: str, ortq: OrtQnn, tmp: str, reps: int, iters: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from qnn_models import build

    import edgeport
    from edgeport.program.reader import load_pte
    from edgeport.runtime import Runtime
    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.blob import unpack_blob

    model, inputs = build(name)
    eager = model(*inputs).detach().numpy()
    feed_np = [x.numpy() for x in inputs]
    onnx_path = os.path.join(tmp, f"{name}.onnx")

    def lower_edgeport() -> bytes:
        ep = torch.export.export(model, inputs)
        return edgeport.to_edge_transform_and_lower(ep, partitioner=[QnnPartitioner()]).to_executorch().buffer

    def lower_ort() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, inputs, onnx_path, dynamo=False, opset_version=17)
        return ortq.session(onnx_path)

    # lowering, interleaved
    t_low: dict[str, list[float]] = {"edgeport": [], "ort": []}
    pte = b""
    for r in range(reps):
        order = [("edgeport", lower_edgeport), ("ort", lower_ort)]
        for label, fn in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            res = fn()
            t_low[label].append(time.perf_counter() - t0)
            if label == "edgeport":
                pte = res

    # context binaries
    lp = load_pte(pte)
    ours_ctx = 0
    delegates = 0
    for pi, plan in enumerate(lp.program.execution_plan):
        for di in range(len(plan.delegates)):
            _, binary = unpack_blob(bytes(lp.delegate_data(pi, di)))
            ours_ctx += len(binary)
            delegates += 1
    ctx_model = os.path.join(tmp, f"{name}_ctx.onnx")
    ortq.session(onnx_path, dump_context=ctx_model)
    bins = [f for f in os.listdir(tmp) if f.startswith(f"{name}_ctx") and f.endswith(".bin")]
    theirs_ctx = sum(os.path.getsize(os.path.join(tmp, f)) for f in bins)

    # load, interleaved
    rt = Runtime.get()
    t_load: dict[str, list[float]] = {"edgeport": [], "ort_ctx": [], "ort_onnx": []}
    method = sess = None
    for r in range(reps):
        order = ["edgeport", "ort_ctx", "ort_onnx"]
        for label in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            if label == "edgeport":
                method = rt.load_program(pte).load_method("forward")
            elif label == "ort_ctx":
                sess = ortq.session(ctx_model)
            else:
                ortq.session(onnx_path)
            t_load[label].append(time.perf_counter() - t0)
    assert method is not None and sess is not None
    feed = {sess.get_inputs()[0].name: feed_np[0]}

    # latency, interleaved; "qnn": the bare graphExecute call (ctypes, tensors prepared once) on the same
    # context binary, i.e. the time inside QNN, to split edgeport's latency into inside / outside graphExecute
    (ours,) = method.execute(feed_np)
    (theirs,) = sess.run(None, feed)
    bare = _bare_execute(pte, feed_np)
    t_run: dict[str, list[float]] = {"edgeport": [], "ort": [], "qnn": []}
    for i in range(iters):
        order = [("edgeport", lambda: method.execute(feed_np)), ("ort", lambda: sess.run(None, feed)),
                 ("qnn", bare)]
        for label, fn in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fn()
            t_run[label].append(time.perf_counter() - t0)

    scale = float(np.abs(eager).max())
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    return {
        "model": name, "delegates": delegates,
        "low_ours": statistics.median(t_low["edgeport"]), "low_theirs": statistics.median(t_low["ort"]),
        "load_ours": _median_ms(t_load["edgeport"]), "load_ctx": _median_ms(t_load["ort_ctx"]),
        "load_onnx": _median_ms(t_load["ort_onnx"]),
        "run_ours": _median_ms(t_run["edgeport"]), "run_theirs": _median_ms(t_run["ort"]),
        "run_qnn": _median_ms(t_run["qnn"]),
        "ctx_ours": ours_ctx, "ctx_theirs": theirs_ctx,
        "err_ours": float(np.abs(ours - eager).max()) / scale, "err_theirs": float(np.abs(theirs - eager).max()) / scale,
        "err_between": float(np.abs(ours - theirs).max()) / scale,
    }


def measure(reps: int, iters: int, only: set[str] | None) -> tuple[list[dict[str, Any]], list[str]]:
    ortq = OrtQnn()
    rows, failures = [], []
    for name in MODELS:
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                rows.append(measure_model(name, ortq, tmp, reps, iters))
            except Exception as e:  # noqa: BLE001 -- one model failing on one side is a result, not a crash
                side = "ORT-QNN" if "onnxruntime" in type(e).__module__ else "edgeport or export"
                failures.append(f"`{name}` ({side} failed): {type(e).__name__}: "
                                f"{str(e).strip().splitlines()[-1][:300]}")
        print(f"# {name} done", file=sys.stderr)
    return rows, failures


def report(rows: list[dict[str, Any]], failures: list[str], started: str, seconds: float, reps: int,
           iters: int) -> str:
    from importlib.metadata import version

    import torch

    lines = [SECTION_TITLE, "",
             f"Measured by `bench/qnn.py` on {started}: {os.cpu_count()} CPUs, {cpu_model()}; torch "
             f"{torch.__version__}, onnxruntime {version('onnxruntime')}, onnxruntime-qnn {version('onnxruntime-qnn')} "
             f"(QAIRT 2.51 HTP emulator, used by both), onnx {version('onnx')}. Whole run {seconds:.0f} s; load average "
             f"{loadavg()}.", "",
             "edgeport-qnn vs ONNX Runtime's QNN EP (ORT-QNN: plugin EP, `backend_path` = the wheel's `libQnnHtp.so`, "
             "`htp_arch=75`, no `soc_model` (it switches fp32 graphs to HTP fp16 precision), "
             "`session.disable_cpu_ep_fallback=1`), fp32, one process, the two interleaved. Lowering = export + "
             "edgeport `to_edge_transform_and_lower(...).to_executorch()` / `torch.onnx.export` + session creation "
             f"(median of {reps}; edgeport's partitioner caches per-op-signature backend checks across reps). Load = "
             "edgeport `load_program` + `load_method` from the `.pte` / ORT session from its EPContext model (context "
             f"binary restored) and, in parentheses, from the plain `.onnx` (median of {reps}). Latency = `execute` / "
             f"`run`, median of {iters}; \"inside graphExecute\" = the bare ctypes `graphExecute` call on edgeport's "
             "context binary (tensors bound once), timed in the same interleaved loop: the rest of edgeport's latency "
             "is Python (input checks, output allocation, the executor). Context binary = bytes of QNN context "
             "binary. Error = max |difference| over the eager output's max |value|. The emulator's times say nothing about a phone.", "",
             "| model | delegates | lowering s edgeport / ORT | load ms edgeport / ORT ctx (ORT .onnx) | "
             "latency ms edgeport / ORT | ratio | of which inside graphExecute ms | context binary bytes edgeport / "
             "ORT | error edgeport / ORT / between |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['delegates']} | {r['low_ours']:.3f} / {r['low_theirs']:.3f} | "
            f"{r['load_ours']:.1f} / {r['load_ctx']:.1f} ({r['load_onnx']:.1f}) | "
            f"{r['run_ours']:.3f} / {r['run_theirs']:.3f} | {r['run_ours'] / r['run_theirs']:.2f}x | "
            f"{r['run_qnn']:.3f} | "
            f"{r['ctx_ours']:,} / {r['ctx_theirs']:,} | {r['err_ours']:.1e} / {r['err_theirs']:.1e} / "
            f"{r['err_between']:.1e} |")
    if rows:
        lines += ["", "Per run, outside `graphExecute` (edgeport latency minus the bare call; Python: input checks, "
                  "copies through buffers bound once, the executor and the runtime's dispatch): " + ", ".join(
                      f"{r['model']} {1e3 * (r['run_ours'] - r['run_qnn']):.0f} us" for r in rows)
                  + "; ORT-QNN's whole `run` minus that same bare call: " + ", ".join(
                      f"{r['model']} {1e3 * (r['run_theirs'] - r['run_qnn']):.0f} us" for r in rows)
                  + ". Profile and what changed: `docs/backends/qnn.md` (\"Latency against ORT-QNN\")."]
    if failures:
        lines += ["", "Not measured: " + "; ".join(failures)]
        if any(f.startswith("`encoder` (ORT-QNN") for f in failures):
            lines += ["", "The encoder's failing node is its ONNX `Gelu` (checked separately: a lone `gelu` fails the "
                      "same way): the HTP cannot prepare an fp32 `Gelu`, which edgeport-qnn avoids by building gelu "
                      "from fp32 elementwise ops. Also checked separately: ORT-QNN's fp32 `LayerNormalization` on a "
                      "1x6x16 input is 5.0e-4 off eager (the HTP's reduced-precision layer norm, which edgeport-qnn "
                      "replaces with ReduceMean/elementwise/Rsqrt)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--models", nargs="*", help=f"subset of {', '.join(MODELS)}")
    parser.add_argument("--write-report", action="store_true")
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    rows, failures = measure(a.reps, a.iters, set(a.models) if a.models else None)
    section = report(rows, failures, started, time.perf_counter() - t0, a.reps, a.iters)
    print(section)
    if a.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
