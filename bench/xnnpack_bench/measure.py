"""One model's measurements: lower it both ways, check the outputs, time all contenders, profile edgeport."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from .busy import ChildContender
from .candidates import load_with_shared_pool
from .machine import CpuMeter, git_state, loadavg, wait_quiet
from .models import build_model, lower_edgeport, lower_executorch
from .probe import profile_edgeport
from .timing import interleaved, rel_err, spin_after


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Lower, check, time (interleaved) and profile one model; the dict the report is rendered from."""
    import torch
    from executorch.runtime import Runtime as EtRuntime

    from edgeport.runtime import Runtime

    res: dict[str, Any] = {"name": name}
    model, inputs = build_model(name)
    note = []
    t0 = time.perf_counter()
    et_pte = lower_executorch(name, model, inputs, not args.no_cache)
    res["et_lower_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        ep_pte = lower_edgeport(name, model, inputs, args.threads)
    except (ImportError, AttributeError) as exc:
        if not name.endswith("_int8"):
            raise
        ep_pte = None
        note.append(f"edgeport int8 pending: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an int8 quantizer in progress may fail in many ways
        if not name.endswith("_int8"):
            raise
        ep_pte = None
        note.append(f"edgeport int8 pending: lowering failed: {type(exc).__name__}: {str(exc)[:200]}")
    res["ep_lower_s"] = time.perf_counter() - t0
    diag_pte = None
    if ep_pte is not None and args.diag_threads and args.diag_threads != args.threads:
        diag_pte = lower_edgeport(name, model, inputs, args.diag_threads)

    x_np = [t.numpy().copy() for t in inputs]
    x_t = list(inputs)
    with torch.no_grad():
        ref = model(*inputs).numpy()
    et_method = EtRuntime.get().load_program(et_pte).load_method("forward")
    et_out = et_method.execute(x_t)[0].numpy()
    res["err_et"] = rel_err(et_out, ref)
    fns: dict[str, Callable[[], Any]] = {}

    def eager() -> Any:
        with torch.no_grad():
            return model(*inputs)

    fns["eager"] = eager
    fns["executorch"] = lambda: et_method.execute(x_t)
    method = None
    if ep_pte is not None:
        method = Runtime.get().load_program(ep_pte).load_method("forward")
        ep_out = method.execute(x_np)[0]
        res["err_ep"] = rel_err(ep_out, ref)
        res["err_ep_et"] = rel_err(ep_out, et_out)
        fns["edgeport"] = lambda: method.execute(x_np)
        delegates = [d for d in method._plan._delegates.items if d.kind == "backend"]
        res["delegates"] = [d.backend_id for d in delegates]
        res["pools_distinct"] = len({id(d.handle.pool) for d in delegates if getattr(d.handle, "pool", None)})
        res["portable_ops"] = sorted(method.profile.kernel_libraries)
    if diag_pte is not None:
        diag = Runtime.get().load_program(diag_pte).load_method("forward")
        res["err_diag"] = rel_err(diag.execute(x_np)[0], ref)
        fns["edgeport_diag"] = lambda: diag.execute(x_np)
    system = None
    if ep_pte is not None and getattr(args, "busy_core", False):
        from edgeport_xnnpack import native

        if native.pool_status()[0] == "edgeport":  # edgeport as it was: the same .pte on Debian's pthreadpool
            system = ChildContender(ep_pte, x_np, {"EDGEPORT_XNNPACK_POOL": "system"})
            res["err_system"] = rel_err(system.out, ref)
            res["system_pool"] = list(system.status)
            fns["edgeport_system"] = system  # type: ignore[assignment]
            nogauge = ChildContender(ep_pte, x_np, {"EDGEPORT_XNNPACK_LOAD_GAUGE": "off"})
            res["err_nogauge"] = rel_err(nogauge.out, ref)
            fns["edgeport_nogauge"] = nogauge  # type: ignore[assignment]
    shared = None
    if method is not None and res.get("pools_distinct", 0) > 1 and not args.no_candidates:
        shared, shared_pool = load_with_shared_pool(ep_pte)
        res["err_shared"] = rel_err(shared.execute(x_np)[0], ref)
        fns["edgeport_shared"] = lambda: shared.execute(x_np)
    if name.endswith("_int8") and ep_pte is not None:
        note.append("edgeport side quantized with `edgeport_xnnpack.quantizer.XnnpackQuantizer()` "
                    f"({git_state('backends-xnnpack/src/edgeport_xnnpack/quantizer.py')}), ExecuTorch side with "
                    "its `XNNPACKQuantizer` + `get_symmetric_quantization_config(is_per_channel=True)`; both "
                    "calibrated on the same 5 batches")
    res["waited_s"] = wait_quiet(args.quiet_wait, args.quiet_cores) if args.quiet_wait else 0.0
    pool = next((d.handle.pool for d in delegates if getattr(d.handle, "pool", None)), None) if method else None
    stats0 = pool.stats() if pool is not None else None
    load0 = pool.load_stats() if pool is not None and hasattr(pool, "load_stats") else None
    try:
        with CpuMeter() as cm:
            la0 = loadavg()
            times = interleaved(fns, args.reps, args.gap_ms / 1e3, budget_s=args.budget_s,
                                min_reps=min(args.reps, 20))
    finally:
        if system is not None:
            system.close()
            nogauge.close()
    if stats0 is not None:
        res["pool_stats"] = {k: v - stats0[k] for k, v in pool.stats().items()}
        res["load_stats"] = {k: (v - load0[k] if k in ("solo", "limited", "reads") else v)
                             for k, v in (pool.load_stats() or {}).items()} if load0 else None
    res["loadavg"] = la0
    res["spin_ms"] = {k: spin_after(f) for k, f in fns.items() if not hasattr(f, "calls")}
    res["others_cores"] = cm.others
    res["times"] = {k: (statistics.median(v[1]) * 1e3, min(v[1]) * 1e3) for k, v in times.items()}
    res["times_cold"] = {k: (statistics.median(v[0]) * 1e3, min(v[0]) * 1e3) for k, v in times.items()}
    res["reps"] = len(times["eager"][0])
    if method is not None:
        if not getattr(args, "busy_core", False):  # the profile is of the quiet run's interest
            res["prof"] = profile_edgeport(method, x_np, args.prof_reps, args.gap_ms / 1e3)
        method.release()
    if shared is not None:
        res["prof_shared"] = profile_edgeport(shared, x_np, args.prof_reps, args.gap_ms / 1e3)
        shared.release()
        shared_pool.close()
    res["note"] = "; ".join(note)
    return res
