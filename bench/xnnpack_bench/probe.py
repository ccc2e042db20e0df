"""Where edgeport's time goes: timers around the XNNPACK delegates of a loaded method, and the profiling passes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .timing import interleaved


class Probe:
    """Wraps the XNNPACK delegates of a loaded edgeport method with timers (see the module docstring)."""

    def __init__(self, method: Any, lean: bool = False) -> None:
        """``lean``: time only the XNNPACK library calls (for the outside-XNNPACK share: the other wrappers
        cost time outside XNNPACK themselves)."""
        from edgeport_xnnpack import native
        from edgeport_xnnpack.runtime import HostStep, NativeStep, ShuffleStep, XnnpackHandle

        self.method = method
        plan = method._plan
        self.delegates = [d for d in plan._delegates.items if d.kind == "backend"
                          and isinstance(d.handle, XnnpackHandle)]
        self.acc: dict[str, float] = {}
        self.host: dict[str, float] = {}
        self._undo: list[Callable[[], None]] = []
        self.lib = native.library()
        self.natives = []
        self.host_labels: list[str] = []
        clock = time.perf_counter
        acc, host = self.acc, self.host

        def add(key: str, dt: float) -> None:
            acc[key] = acc.get(key, 0.0) + dt

        xnn = self.lib.xnn
        # inside XNNPACK: the runtime calls and, for channel-shuffle operator steps, the operator calls. With
        # the C glue the library is called from C, which sums the time inside each call itself (two
        # clock_gettime calls; nothing in Python): read before and after each run by `timed_run`.
        self.glue = [s.glue()[0] for d in self.delegates for s in d.handle.steps
                     if isinstance(s, (NativeStep, ShuffleStep)) and s.glue() is not None]
        timed = {"xnn_setup_runtime": "xnn_setup", "xnn_invoke_runtime": "xnn_invoke",
                 "xnn_setup_channel_shuffle_nc_x32": "xnn_setup", "xnn_run_operator": "xnn_invoke"}
        originals = {name: getattr(xnn, name) for name in timed if hasattr(xnn, name)}

        def timer(f: Any, key: str) -> Callable[..., Any]:
            def call(*a: Any) -> Any:  # kept lean: what it adds besides f counts as outside XNNPACK
                t = clock()
                r = f(*a)
                acc[key] = acc.get(key, 0.0) + (clock() - t)
                return r
            return call

        for name, f in originals.items():
            if not self.glue:
                setattr(xnn, name, timer(f, timed[name]))
        self._undo.append(lambda: [setattr(xnn, n, f) for n, f in originals.items()])
        self.setup0, self.invoke0 = originals["xnn_setup_runtime"], originals["xnn_invoke_runtime"]
        self.originals = originals
        self.operators: list[Any] = []
        if lean:
            return
        binders0 = list(plan.binders)

        def wrap_binder(b: Callable[..., Any]) -> Callable[..., Any]:
            def bind(vals: Any, x: Any) -> Any:
                t = clock()
                r = b(vals, x)
                add("bind inputs", clock() - t)
                return r
            return bind

        plan.binders[:] = [wrap_binder(b) for b in binders0]
        self._undo.append(lambda: plan.binders.__setitem__(slice(None), binders0))
        for d in self.delegates:
            ex = d.executor
            ex_exec0 = ex.execute

            def ex_exec(handle: Any, inputs: Any, out: Any = None, _f: Any = ex_exec0) -> Any:
                t = clock()
                r = _f(handle, inputs) if out is None else _f(handle, inputs, out=out)
                add("executor.execute", clock() - t)
                return r

            ex.execute = ex_exec
            self._undo.append(lambda ex=ex: ex.__dict__.pop("execute", None))
            direct0 = d.handle.direct
            if direct0 is not None:  # all steps through the C glue in one call: its time is "Runtime.run"
                def direct(ins: Any, out: Any, _f: Any = direct0) -> Any:
                    t = clock()
                    r = _f(ins, out)
                    add("Runtime.run", clock() - t)
                    return r

                d.handle.direct = direct
                self._undo.append(lambda h=d.handle, f=direct0: setattr(h, "direct", f))
            for step in d.handle.steps:
                if isinstance(step, (NativeStep, ShuffleStep)):
                    obj, name = (step.runtime, "run_list") if isinstance(step, NativeStep) else (step.op, "run")
                    if isinstance(step, NativeStep):
                        self.natives.append(step.runtime)
                    else:
                        self.operators.append(step.op)
                    run0 = getattr(obj, name)

                    def run(*a: Any, _f: Any = run0) -> Any:
                        t = clock()
                        r = _f(*a)
                        add("Runtime.run", clock() - t)
                        return r

                    setattr(obj, name, run)
                    self._undo.append(lambda obj=obj, name=name: obj.__dict__.pop(name, None))
                elif isinstance(step, HostStep):
                    label = step.label
                    self.host_labels.append(label)
                    seg = step.segment
                    fn0 = seg.run

                    def fn(env: Any, _f: Any = fn0, _label: str = label) -> Any:
                        t = clock()
                        r = _f(env)
                        dt = clock() - t
                        host[_label] = host.get(_label, 0.0) + dt
                        add("host steps", dt)
                        return r

                    seg.run = fn
                    self._undo.append(lambda seg=seg: seg.__dict__.pop("run", None))

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _glue_ns(self) -> tuple[int, int]:
        return sum(b.setup_ns for b in self.glue), sum(b.run_ns for b in self.glue)

    def timed_run(self, x_np: list[Any]) -> dict[str, float]:
        """One ``method.execute``: its wall time (``total``) and what the timers summed during it. The C glue's
        counters are read before and after, outside the timed region."""
        self.acc.clear()
        ns0 = self._glue_ns() if self.glue else (0, 0)
        t = time.perf_counter()
        self.method.execute(x_np)
        total = time.perf_counter() - t
        if self.glue:
            (s0, r0), (s1, r1) = ns0, self._glue_ns()
            self.acc["xnn_setup"] = self.acc.get("xnn_setup", 0.0) + (s1 - s0) * 1e-9
            self.acc["xnn_invoke"] = self.acc.get("xnn_invoke", 0.0) + (r1 - r0) * 1e-9
        return {"total": total, **self.acc}

    def bare_setup(self) -> None:
        """The bare loop's calls: ``xnn_invoke_runtime`` of every native runtime and ``xnn_run_operator`` of every
        operator step, on the buffers the executor last set them up with (the executor re-runs setup only when a
        pointer changes, so in a steady loop it only invokes; the buffers stay referenced by the executor)."""
        self._bare = [(self.invoke0, (rt.handle,)) for rt in self.natives]
        run_op = self.originals.get("xnn_run_operator")
        for op in self.operators:
            self._bare.append((run_op, (op.handle, op.pool.handle if op.pool else None)))

    def bare_xnnpack(self) -> None:
        """What the executor's steps spend inside XNNPACK in a steady loop, nothing else."""
        for fn, args in self._bare:
            fn(*args)

    def summary(self) -> dict[str, Any]:
        steps = {"delegates": len(self.delegates), "native": 0, "host": 0, "operator": 0}
        from edgeport_xnnpack.runtime import NativeStep, ShuffleStep

        for d in self.delegates:
            for s in d.handle.steps:
                steps["native" if isinstance(s, NativeStep) else "operator" if isinstance(s, ShuffleStep) else "host"] += 1
        return steps


def profile_edgeport(method: Any, x_np: list[Any], reps: int, gap_s: float = 0.05) -> dict[str, Any]:
    """Instrumented runs: medians per run of each component (ms), host steps and portable ops (ms/run)."""
    probe = Probe(method)
    prof = method.profile
    prof.op_seconds.clear()
    prof.op_calls.clear()
    runs: list[dict[str, float]] = []
    lean_runs: list[dict[str, float]] = []
    try:
        method.time_ops = True
        for _ in range(3):
            method.execute(x_np)
        probe.acc.clear()
        probe.host.clear()
        prof.op_seconds.clear()
        prof.op_calls.clear()
        runs = [probe.timed_run(x_np) for _ in range(reps)]
        method.time_ops = False
        op_ms = {k: v / reps * 1e3 for k, v in prof.op_seconds.items()}
        host_ms = {k: v / reps * 1e3 for k, v in probe.host.items()}
        # uninstrumented estimate: method.execute vs the bare XNNPACK calls, interleaved
        probe.close()
        probe.bare_setup()
        bare = {k: v[-1] for k, v in interleaved(
            {"execute": lambda: method.execute(x_np), "xnnpack": probe.bare_xnnpack}, max(reps, 20), gap_s,
            warmup=2).items()}
        # the share outside XNNPACK, from a lean pass: only the library calls are timed, no op timing
        lean = Probe(method, lean=True)
        try:
            lean_runs = [lean.timed_run(x_np) for _ in range(reps)]
        finally:
            lean.close()
    finally:
        method.time_ops = False
        probe.close()

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in runs) * 1e3

    share = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0)) / r["total"] for r in lean_runs]
    share_full = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0)) / r["total"] for r in runs]
    share_host = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0) - r.get("host steps", 0.0))
                  / r["total"] for r in runs]
    comps = {k: med(k) for k in ("total", "bind inputs", "executor.execute", "Runtime.run", "xnn_setup", "xnn_invoke",
                                 "host steps")}
    comps["portable ops"] = sum(v for k, v in op_ms.items() if not k.startswith("delegate"))
    return {
        "steps": probe.summary(),
        "glue": "c" if probe.glue else "python",
        "components_ms": comps,
        "outside_share": statistics.median(share),
        "outside_share_min": min(share),
        "outside_share_full_probe": statistics.median(share_full),
        "outside_share_excl_host": statistics.median(share_host),
        "bare_ms": statistics.median(bare["xnnpack"]) * 1e3,
        "bare_execute_ms": statistics.median(bare["execute"]) * 1e3,
        "host_ms": dict(sorted(host_ms.items(), key=lambda kv: -kv[1])),
        "op_ms": dict(sorted(op_ms.items(), key=lambda kv: -kv[1])),
    }
