"""The markdown section of bench/REPORT.md: the latency, profile, candidate and spinning tables."""

from __future__ import annotations

import argparse
import re
from typing import Any

from .hot_spots import hot_spots
from .settings import CNNS, REPORT, SECTION, TEAM_EAGER_MS, TEAM_ET_MS


def _fmt_ms(t: tuple[float, float] | None) -> str:
    return "n/a" if t is None else f"{t[0]:.2f} / {t[1]:.2f}"


def _ratio(a: tuple[float, float] | None, b: tuple[float, float] | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a[0] / b[0]:.2f}x / {a[1] / b[1]:.2f}x"


def _latency_table(results: list[dict[str, Any]], key: str, dt: int | None) -> list[str]:
    """Markdown rows of the latency table of ``key`` (``times``: warm, ``times_cold``: cold)."""
    L: list[str] = []
    diag_h = f" edgeport, {dt} thread{'s' if dt != 1 else ''} (diagnostic) |" if dt else ""
    L.append("| model | eager PyTorch | ExecuTorch + XNNPACK | edgeport + XNNPACK | edgeport / ExecuTorch "
             f"| edgeport / eager | goal | team's ET (eager) | err edgeport / ET / edgeport vs ET | XNNPACK steps |{diag_h} "
             "reps | other load |")
    L.append("|---|---:|---:|---:|---:|---:|---|---:|---:|---|" + ("---:|" if dt else "") + "---:|---:|")
    for r in results:
        if "error" in r:
            L.append(f"| {r['name']} | failed: {r['error']} ||||||||||||")
            continue
        t = r[key]
        ep, et, eg = t.get("edgeport"), t.get("executorch"), t.get("eager")
        goal_txt, ref, bound = "-", None, None
        if r["name"] in CNNS:
            goal_txt, ref, bound = "<= 1.25x ET", et, 1.25
        elif r["name"] == "encoder":
            goal_txt, ref, bound = "<= 1.0x eager", eg, 1.0
        goal = goal_txt
        if ep is None and ref is not None:
            goal = f"{goal_txt}: pending"
        elif ref is not None:
            met_med, met_min = ep[0] / ref[0] <= bound, ep[1] / ref[1] <= bound
            verdict = ("met" if met_med and met_min else "**missed**" if not (met_med or met_min)
                       else f"met by the {'median' if met_med else 'min'}, **missed** by the "
                            f"{'min' if met_med else 'median'}")
            goal = f"{goal_txt}: {verdict}"
        team = f"{TEAM_ET_MS[r['name']]:g}" if r["name"] in TEAM_ET_MS else "-"
        if r["name"] in TEAM_EAGER_MS:
            team += f" ({TEAM_EAGER_MS[r['name']]:g})"
        err = (f"{r.get('err_ep', float('nan')):.1e} / {r['err_et']:.1e} / {r.get('err_ep_et', float('nan')):.1e}"
               if ep is not None else f"- / {r['err_et']:.1e} / -")
        steps = "-"
        if "prof" in r:
            s = r["prof"]["steps"]
            steps = (f"{s['delegates']} delegate(s): {s['native']} native, {s.get('operator', 0)} operator (channel "
                     f"shuffle), {s['host']} host")
            if r.get("portable_ops"):
                steps += f"; {len(r['portable_ops'])} portable op kinds"
        L.append(f"| {r['name']} | {_fmt_ms(eg)} | {_fmt_ms(et)} | {_fmt_ms(ep) if ep else 'pending'} "
                 f"| {_ratio(ep, et)} | {_ratio(ep, eg)} | {goal} | {team} | {err} | {steps} "
                 + (f"| {_fmt_ms(t['edgeport_diag'])} ({_ratio(t['edgeport_diag'], et)} ET) " if dt and "edgeport_diag" in t
                    else ("| - " if dt else ""))
                 + f"| {r['reps']} | {r['others_cores']:.2f} |")
    return L


def render(results: list[dict[str, Any]], meta: dict[str, str], args: argparse.Namespace,
           candidate: dict[str, tuple[float, float]] | None = None) -> str:
    """The markdown body of the report section for one run."""
    L: list[str] = []
    L.append(f"Measured by `bench/xnnpack.py{' --quick' if args.quick else ''}` on {meta['date']} (edgeport at "
             f"{meta.get('commit', 'unknown')}): "
             f"{meta['nproc']} CPUs (`nproc`), {meta['cpu']}; Python {meta['python']}, torch {meta['torch']}, "
             f"executorch {meta['executorch']}, numpy {meta['numpy']}, libXNNPACK {meta['libxnnpack']}; "
             f"{meta['platform']}. Threads: {args.threads} for every contender (eager `torch.set_num_threads`, "
             f"ExecuTorch's threadpool: {meta['et_threads']}, edgeport's executor pool: `XnnpackCompileOptions("
             f"num_threads={args.threads})`). Load average (1/5/15 min) at start {meta['load_start']}, at end "
             f"{meta['load_end']}; whole run {meta['wall']}.")
    L.append("")
    L.append(f"Each cell is `median / min` ms over up to {args.reps} interleaved repetitions (column reps; a model's "
             f"loop stops after {args.budget_s:g} s). A repetition visits every contender once, in an order rotated "
             f"per repetition: sleep {args.gap_ms:g} ms (so the previous contender's spinning worker threads park), "
             "call it once (the *cold* sample: first call after idling), and call it again at once (the *warm* "
             "sample: steady state, as in a loop). The first table is warm, the second cold. Ratios are median / "
             "median and min / min. err = max |out - eager| / max |eager| (the int8 row is compared with the float "
             "eager model, so it includes the quantization error); the third err is edgeport against ExecuTorch's "
             "output. `other load` = cores kept busy by other processes during the timed loop (from /proc/stat "
             "minus this process). The goals are judged against the ExecuTorch and eager numbers of this run, by the "
             "median and by the min; the team's earlier references are shown for orientation only.")
    L.append("")
    dt = args.diag_threads if args.diag_threads and args.diag_threads != args.threads else None
    L += _latency_table(results, "times", dt)
    L.append("")
    L.append("Cold (the first call after the idle gap), same repetitions:")
    L.append("")
    L += _latency_table(results, "times_cold", dt)
    notes = [f"- {r['name']}: {r['note']}" for r in results if r.get("note")]
    if notes:
        L.append("")
        L.extend(notes)
    L.append("")
    L.append("### Where edgeport's time goes")
    L.append("")
    glue_kind = {p.get("glue", "python") for r in results for p in (r.get("prof"), r.get("prof_shared")) if p}
    L.append("Instrumented pass on edgeport's 2-thread method (timers wrapped around the input binders, the "
             "executor's `execute`, each native runtime's `run_list` and channel-shuffle operator's `run` -- or the "
             "one direct call of a delegate whose steps all run through the C glue --, and each numpy host segment; "
             "the time inside the library calls "
             + ("summed in C by the C glue `edgeport_xnnpack._glue`, which makes them"
                if glue_kind == {"c"} else "from Python timers around the ctypes functions")
             + "; `method.time_ops` for portable kernels), "
             f"medians of {args.prof_reps} runs in ms. Core runtime = `method.execute` outside the executor (input "
             "binding, portable kernels, the rest: interpreter loop, delegate output copies, output "
             "copies); executor glue = `execute` outside the native, operator and host steps; `Runtime.run` binding = "
             "the glue (C or Python/ctypes) around the library calls. xnn_setup / xnn_invoke = time inside XNNPACK's setup and run "
             "calls of runtimes and operators (the NCHW <-> NHWC channel shuffles run on XNNPACK's operator API and "
             "count as XNNPACK). outside XNNPACK = (execute - setup - invoke) / execute, median (min) of the per-run "
             "shares, from a lean pass that times only the library calls (no other wrapper); `full probe` = the same "
             "share under all the wrappers above. `bare` = median of a loop of only the invoke / run-operator calls "
             "on the buffers the executor last set up (it re-runs setup only when a pointer changes), interleaved "
             "with `method.execute`: outside (bare) = 1 - bare / execute.")
    L.append("")
    L.append("| model | method.execute | core: bind inputs | core: portable ops | core: rest | executor glue "
             "| host steps | Runtime.run binding | xnn_setup | xnn_invoke | outside XNNPACK | full probe "
             "| excl. host steps | bare XNNPACK / execute | outside (bare) |")
    L.append("|---|" + "---:|" * 14)
    profs = []
    for r in results:
        if r.get("prof"):
            profs.append((r["name"], r["prof"]))
        if r.get("prof_shared"):
            profs.append((f"{r['name']}, one shared pool (candidate fix)", r["prof_shared"]))
    for label, p in profs:
        c = p["components_ms"]
        core_rest = c["total"] - c["executor.execute"] - c["bind inputs"] - c["portable ops"]
        glue = c["executor.execute"] - c["Runtime.run"] - c["host steps"]
        binding = c["Runtime.run"] - c["xnn_setup"] - c["xnn_invoke"]
        L.append(f"| {label} | {c['total']:.3f} | {c['bind inputs']:.3f} | {c['portable ops']:.3f} "
                 f"| {core_rest:.3f} | {glue:.3f} | {c['host steps']:.3f} | {binding:.3f} "
                 f"| {c['xnn_setup']:.3f} | {c['xnn_invoke']:.3f} "
                 f"| {p['outside_share'] * 100:.1f}% ({p['outside_share_min'] * 100:.1f}%) "
                 f"| {p.get('outside_share_full_probe', float('nan')) * 100:.1f}% "
                 f"| {p['outside_share_excl_host'] * 100:.1f}% | {p['bare_ms']:.3f} / {p['bare_execute_ms']:.3f} "
                 f"| {(1 - p['bare_ms'] / p['bare_execute_ms']) * 100:.1f}% |")
    L.append("")
    for label, p in profs:
        items = [f"host {k}: {v:.3f}" for k, v in list(p["host_ms"].items())[:8]]
        if len(p["host_ms"]) > 8:
            items.append(f"{len(p['host_ms']) - 8} more host step shapes: {sum(list(p['host_ms'].values())[8:]):.3f}")
        ops = [(k, v) for k, v in p["op_ms"].items() if not k.startswith("delegate")]
        items += [f"portable {k}: {v:.3f}" for k, v in ops[:8]]
        if items:
            L.append(f"- {label} (ms per run): " + "; ".join(items))
    cands = [r for r in results if "edgeport_shared" in r.get("times", {})]
    if cands:
        L.append("")
        L.append("Candidate fix measured in the same interleaved loop: the executor creates one pthreadpool per "
                 "delegate (`XnnpackHandle.pool`); here the same program is loaded with every delegate sharing one "
                 "2-thread pool (bench-only patch of `edgeport_xnnpack.native.ThreadPool` while loading), median / "
                 "min ms:")
        L.append("")
        L.append("| model | delegates | edgeport as shipped (a pool per delegate), warm "
                 "| edgeport, one shared pool, warm | shared / ExecuTorch (warm) | shared / eager (warm) "
                 "| err (shared) |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for r in cands:
            t, c = r["times"], r["times_cold"]
            L.append(f"| {r['name']} | {len(r['delegates'])} | {_fmt_ms(t['edgeport'])} (cold {_fmt_ms(c['edgeport'])}) "
                     f"| {_fmt_ms(t['edgeport_shared'])} (cold {_fmt_ms(c['edgeport_shared'])}) "
                     f"| {_ratio(t['edgeport_shared'], t['executorch'])} "
                     f"| {_ratio(t['edgeport_shared'], t['eager'])} | {r.get('err_shared', float('nan')):.1e} |")
    spins = [r for r in results if r.get("spin_ms")]
    if spins:
        L.append("")
        L.append("Worker threads spinning after a call returns: CPU ms this process burns while its main thread "
                 "sleeps for the 100 ms right after one call (median of 5; ~0 means the pool parks at once):")
        L.append("")
        cols = [("eager", "eager"), ("executorch", "ExecuTorch"), ("edgeport", "edgeport"),
                ("edgeport_diag", f"edgeport, {dt} thread" if dt else ""),
                ("edgeport_shared", "edgeport, one shared pool")]
        cols = [(k, h) for k, h in cols if any(k in r["spin_ms"] for r in spins)]
        L.append("| model | " + " | ".join(h for _, h in cols) + " |")
        L.append("|---|" + "---:|" * len(cols))
        for r in spins:
            L.append(f"| {r['name']} | " + " | ".join(
                f"{r['spin_ms'][k]:.1f}" if k in r["spin_ms"] else "-" for k, _ in cols) + " |")
    if candidate:
        L.append("")
        L.append("Candidate fix for the CNNs' one host step (the NCHW -> NHWC input transpose, 1x3x224x224), single "
                 "thread, median / min ms: " + "; ".join(f"{k}: {v[0]:.3f} / {v[1]:.3f}" for k, v in candidate.items()))
    L += hot_spots(results, candidate or {}, args)
    return "\n".join(L) + "\n"


def write_report(body: str, title: str = SECTION) -> None:
    """Replace the ``title`` section of bench/REPORT.md with ``body``; a new one goes right after the
    ``SECTION`` section (or at the end)."""
    text = REPORT.read_text() if REPORT.exists() else "# edgeport benchmarks\n"
    section = f"{title}\n\n{body}"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == title), None)
    after = next((i for i, ln in enumerate(lines) if ln.rstrip() == SECTION), None)
    if start is None and after is not None:
        end = next((i for i in range(after + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
        text = "".join(lines[:end]).rstrip("\n") + "\n\n" + section + "\n" + "".join(lines[end:])
    elif start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
        tail = "".join(lines[end:])
        text = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    REPORT.write_text(text)
