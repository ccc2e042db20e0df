"""The report's hot-spot findings, written from one run's numbers, and the fixes they point to."""

from __future__ import annotations

import argparse
import re
from typing import Any


def hot_spots(results: list[dict[str, Any]], candidate: dict[str, tuple[float, float]],
              args: argparse.Namespace) -> list[str]:
    """The findings of this run, with its numbers, and the fixes they point to."""
    by = {r["name"]: r for r in results if "times" in r}
    L = ["", "### Hot spots (numbers from this run) and the fixes they point to", ""]

    def t(name: str, who: str) -> tuple[float, float] | None:
        return by.get(name, {}).get("times", {}).get(who)

    # 1. the thread pools
    enc = by.get("encoder", {})
    ep_e, sh_e, d1_e = t("encoder", "edgeport"), t("encoder", "edgeport_shared"), t("encoder", "edgeport_diag")
    spin = [f"{n} {r['spin_ms']['edgeport']:.0f} ms" for n, r in by.items() if "edgeport" in r.get("spin_ms", {})]
    per_delegate = ep_e and sh_e
    spin_txt = ("this pthreadpool's threads spin-wait up to 1M iterations after every parallel operator before "
                "they sleep, so the worker keeps a core busy for ~30 ms after `execute` returns (CPU burnt in the "
                "100 ms after a call: " + (", ".join(spin) or "n/a") + "; ExecuTorch's newer pthreadpool parks at "
                "once).")
    own = [r for r in by.values() if r.get("pool_stats")]
    if own and not per_delegate:
        spun = ", ".join(f"{n} {r['spin_ms']['edgeport']:.1f} ms" for n, r in by.items()
                         if "edgeport" in r.get("spin_ms", {})) or "n/a"
        stats = "; ".join(f"{n}: {r['pool_stats'].get('parallel', 0)} parallel calls, "
                          f"{r['pool_stats'].get('joins', 0)} worker joins, {r['pool_stats'].get('solo', 0)} on the "
                          f"caller alone, {r['pool_stats'].get('moved', 0)} moves off the caller's CPU"
                          for n, r in by.items() if r.get("pool_stats"))
        txt = ("1. **Thread pool: edgeport's own (`edgeport_xnnpack._pool`), in place of Debian's pthreadpool of "
                 "2021-05** (which spun ~30 ms after every operator and waited for descheduled workers). Workers "
                 "spin 200 us after a job, then park; the caller always works and steals what a late worker has "
                 "not started; a load gauge on CPU time runs the calls on the caller alone while other programs "
                 "keep the cores busy (see the next section). CPU burnt in the 100 ms after a call: " + spun
                 + ". Counters of the timed loop: " + stats + ".")
    else:
        if per_delegate:
            txt = ("1. **Thread pools: one per delegate, each spinning (Debian's pthreadpool of 2021-05).** The "
                   "executor creates a pthreadpool per delegate, and " + spin_txt)
            s_ = enc.get("delegates", [])
            txt += (f" With {len(s_)} delegates in the encoder, the still-spinning workers of the previous delegates "
                    f"take the cores the next delegate's pool needs, and every operator waits for a descheduled "
                    f"worker: {ep_e[0]:.2f} ms median on 2 threads"
                    + (f" against {d1_e[0]:.2f} ms on 1 thread" if d1_e else "")
                    + f"; the same program with all delegates sharing one pool runs in {sh_e[0]:.2f} ms "
                    f"(min {sh_e[1]:.2f}).")
        else:
            n_del = len(enc.get("delegates", []))
            txt = ("1. **Thread pool (Debian's pthreadpool of 2021-05).** The executor shares one pool per thread "
                   + (f"count across delegates (all {n_del} encoder delegates use one pool), but " if n_del > 1
                      else "count across delegates, but ") + spin_txt)
        loaded = [f"{n} {t(n, 'edgeport')[0]:.1f} ms median vs {t(n, 'edgeport')[1]:.1f} ms min with "
                  f"{r['others_cores']:.2f} cores taken" for n, r in by.items()
                  if t(n, "edgeport") and r["others_cores"] > 0.3]
        txt += (" When another process holds a core, a spinning pool waits for its descheduled worker at every "
                "operator, so the medians explode while the minimums stay low"
                + (": " + "; ".join(loaded) if loaded else " (this run had no such model, see `other load`; an "
                   "earlier run of this bench with ~1 core taken measured MobileNetV2 at ~0.4 s median)") + ". "
                "Fixes: an ABI-compatible newer libpthreadpool (bounded spin, no waiting for workers that were never "
                "woken) loaded ahead of libXNNPACK" + ("" if not per_delegate else ", and one process-wide pool per "
                "thread count in the executor (what ExecuTorch does)") + "; meanwhile `num_threads=1` when the "
                "cores are known to be shared.")
        cold = []
        for n, r in by.items():
            w, c = r["times"].get("edgeport"), r.get("times_cold", {}).get("edgeport")
            we, ce = r["times"].get("executorch"), r.get("times_cold", {}).get("executorch")
            if w and c and c[0] > 1.3 * w[0]:
                cold.append(f"{n} {c[0]:.2f} ms cold vs {w[0]:.2f} ms warm (ExecuTorch {ce[0]:.2f} vs {we[0]:.2f})")
        if cold:
            txt += (" The first call after idling is slow too, likely because the old pool waits for every worker "
                    "at every operator and a parked worker (or vCPU) wakes slowly: " + "; ".join(cold) + ".")
    L.append(txt)
    # int8 kernels
    r8 = by.get("mobilenet_v2_int8", {})
    p8, et8 = r8.get("prof"), t("mobilenet_v2_int8", "executorch")
    if p8 and et8:
        c8 = p8["components_ms"]
        L.append(f"1. **int8 kernels.** edgeport's int8 MobileNetV2 spends {c8['xnn_invoke']:.2f} ms (median) inside "
                 f"`xnn_invoke_runtime`, while ExecuTorch's whole run takes {et8[1]:.2f} ms at best (median "
                 f"{et8[0]:.2f} ms). The 2022 library has no AVX512-VNNI int8 GEMM kernels (objdump: no `vpdpbusd` in "
                 "Debian's libXNNPACK.so.0, ~1000 in ExecuTorch's libexecutorch_backend_xnnpack.so; this CPU has "
                 "avx512_vnni), so against ExecuTorch's best runs edgeport's int8 cannot keep up; the goal holds by the "
                 "median only because ExecuTorch's own runs spread so widely. Fix: a newer "
                 "libXNNPACK (the executor's binding is the subgraph API, stable enough to follow), nothing in "
                 "edgeport's Python.")
    # 2. the NCHW <-> NHWC transposes of the CNNs
    cnn = []
    for name in ("mobilenet_v2", "mobilenet_v2_int8", "resnet18"):
        p = by.get(name, {}).get("prof")
        if p:
            c, st = p["components_ms"], p["steps"]
            where = (f"{st.get('operator', 0)} channel-shuffle operator step(s)" if st.get("operator")
                     else f"{st['host']} numpy host step(s), {c['host steps']:.3f} ms")
            cnn.append(f"{name}: {where}")
    if cnn:
        np_t = next((v for k, v in candidate.items() if k.startswith("numpy")), None)
        xs_t = next((v for k, v in candidate.items() if k.startswith("xnn")), None)
        alone = (f" (alone, single thread, warm caches: numpy {np_t[0]:.3f} ms, channel shuffle {xs_t[0]:.3f} ms; "
                 "inside a run the image is no longer in cache and the shuffle takes longer)" if np_t and xs_t else "")
        L.append("2. **The CNNs' NCHW -> NHWC input transpose** (the 2022 library has no transpose node): the executor "
                 "runs 2-D transposes of 32-bit elements on XNNPACK's `channel_shuffle_nc_x32` operator "
                 "(groups = C, group_channels = H*W), created once per delegate, set up again only when a pointer "
                 "changes; its time counts as XNNPACK time" + alone + ". " + "; ".join(cnn) + ".")
    # 3. the outside-XNNPACK share of MobileNetV2
    p = by.get("mobilenet_v2", {}).get("prof")
    if p:
        c = p["components_ms"]
        glue = c["executor.execute"] - c["Runtime.run"] - c["host steps"]
        binding = c["Runtime.run"] - c["xnn_setup"] - c["xnn_invoke"]
        core_rest = c["total"] - c["executor.execute"] - c["bind inputs"] - c["portable ops"]
        L.append(f"3. **MobileNetV2 outside XNNPACK: {p['outside_share'] * 100:.1f}%** of `method.execute` "
                 f"(median of the lean pass's runs; lowest run {p['outside_share_min'] * 100:.1f}%; goal < 3%; "
                 f"{p.get('outside_share_full_probe', float('nan')) * 100:.1f}% under the full probe; "
                 f"bare-loop estimate {(1 - p['bare_ms'] / p['bare_execute_ms']) * 100:.1f}%). Per run (full probe): "
                 f"input binding {c['bind inputs']:.3f} ms, the rest of the core runtime {core_rest:.3f} ms, "
                 f"executor glue {glue:.3f} ms, "
                 + ("the C glue" if p.get("glue") == "c" else "Python/ctypes")
                 + f" around the library calls {binding:.3f} ms (with the C glue this includes the host "
                 "kernels it runs as steps -- the 1x1 convolutions on the fully connected stand-in --, which are "
                 "compute, not overhead: the share is an upper bound of the overhead), "
                 f"`xnn_setup_runtime` {c['xnn_setup']:.3f} ms (run only when a bound pointer changes). "
                 + ("The executor binds and invokes through the C glue `edgeport_xnnpack._glue` (one C call per "
                    "step, and no per-step Python for a delegate whose steps all run in XNNPACK); what remains "
                    if p.get("glue") == "c" else "What remains ")
                 + "is Python around the delegate call.")
    # 4. the encoder
    r = by.get("encoder")
    if r and r.get("prof"):
        p = r.get("prof_shared") or r["prof"]
        which = "with one shared pool, the candidate pool fix" if r.get("prof_shared") else "as shipped"
        c = p["components_ms"]
        s = p["steps"]
        ln = p["op_ms"].get("aten::native_layer_norm.out", 0.0)
        portable = sum(v for k, v in p["op_ms"].items() if not k.startswith("delegate"))
        eg, ep1 = t("encoder", "eager"), t("encoder", "edgeport_diag")
        L.append(f"4. **Transformer encoder** (profiled {which}): {s['delegates']} delegates, {s['native']} "
                 f"native XNNPACK runtimes and {s['host']} numpy host segments per run (the 2022 library has no "
                 "batch matmul, transpose or slice node; the executor schedules each delegate's nodes so that they "
                 "cluster, runs reshapes, transposes and slices as numpy views and materializes only values that "
                 "leave a segment, the batch matmuls writing straight into them on one OpenBLAS thread). Per run: "
                 f"host segments {c['host steps']:.3f} ms, portable kernels outside the delegates {portable:.3f} ms"
                 + (f" (layer norm {ln:.3f} ms)" if ln else "")
                 + f", `xnn_setup_runtime` {c['xnn_setup']:.3f} ms, Python/ctypes around {s['native']} runtimes "
                 f"{c['Runtime.run'] - c['xnn_setup'] - c['xnn_invoke']:.3f} ms, XNNPACK compute "
                 f"{c['xnn_invoke']:.3f} ms"
                 + (f"; eager takes {eg[0]:.2f} ms (min {eg[1]:.2f}) for everything" if eg else "")
                 + (f", edgeport on 1 thread {ep1[0]:.2f} ms" if ep1 else "") + ". Left outside XNNPACK "
                 f"({c['total'] - c['xnn_invoke'] - c['xnn_setup']:.2f} ms of {c['total']:.2f} ms): the attention's "
                 "all-masked-row check on portable kernels (the 2022 library has no comparison node) and the "
                 "numpy batch matmuls (a newer libXNNPACK has batch matmul and transpose nodes).")
    L.append("")
    n = 0
    for i, line in enumerate(L):  # number the items that were written
        m = re.match(r"^\d\. ", line)
        if m:
            n += 1
            L[i] = f"{n}. " + line[m.end():]
    return L
