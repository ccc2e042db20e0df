"""Child process of bench/runtime_peer.py: executorch-numpy-runtime, run in its own Python >= 3.12 venv.

Reads one JSON request per line on stdin and answers one JSON line on the original stdout (fd 1 is pointed at
stderr first, so nothing the C++ runtime prints can corrupt the answers). numpy and executorch-numpy-runtime are
the only imports: no torch, no edgeport.

Requests: ``{"op": "info", "threads": N}`` (sets the runtime's XNNPACK thread pool to N threads, before any
program is loaded, through the ``ThreadPool::_unsafe_reset_threadpool`` the wheel exports; answers the versions
and the pool's thread count before and after), ``{"op": "load", "name", "pte", "inputs": [npy], "outputs": dir}``
(loads from bytes, or from the file with ``"from_path": true``; runs once, saves the outputs as ``<dir>/<name>.<i>.npy``), ``{"op": "time", "name", "n",
"warmup"}`` (``warmup`` untimed calls, then ``n`` timed ones: seconds of each, ``time.perf_counter``),
``{"op": "quit"}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback
from typing import Any


def _pool_api(core_path: str) -> tuple[Any, Any, Any]:
    lib = ctypes.CDLL(core_path)
    get_pool = lib._ZN10executorch9extension10threadpool14get_threadpoolEv
    get_pool.restype = ctypes.c_void_p
    get_pthreadpool = lib._ZN10executorch9extension10threadpool15get_pthreadpoolEv
    get_pthreadpool.restype = ctypes.c_void_p
    count = lib.pthreadpool_get_threads_count
    count.argtypes, count.restype = [ctypes.c_void_p], ctypes.c_size_t
    reset = lib._ZN10executorch9extension10threadpool10ThreadPool24_unsafe_reset_threadpoolEj
    reset.argtypes, reset.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.c_bool

    def threads() -> int:
        return int(count(get_pthreadpool()))

    def set_threads(n: int) -> bool:
        return bool(reset(get_pool(), n))

    return threads, set_threads, lib


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import executorch_numpy_runtime as en
    import numpy as np

    methods: dict[str, Any] = {}
    inputs: dict[str, list[Any]] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            op = req["op"]
            if op == "quit":
                break
            if op == "info":
                threads, set_threads, _lib = _pool_api(en._core.__file__)
                before = threads()
                ok = set_threads(int(req["threads"])) if req.get("threads") else True
                ans: dict[str, Any] = {"version": en.__version__, "et_version": en.__et_version__,
                                       "threads_before": before, "threads": threads(), "reset_ok": ok,
                                       "python": sys.version.split()[0], "numpy": np.__version__}
            elif op == "load":
                name = req["name"]
                if req.get("from_path"):
                    program = en.Runtime.get().load_program(req["pte"])
                else:
                    with open(req["pte"], "rb") as f:
                        program = en.Runtime.get().load_program(f.read())
                method = program.load_method("forward")
                xs = [np.load(p) for p in req["inputs"]]
                outs = method(xs)
                paths = []
                for i, o in enumerate(outs):
                    path = os.path.join(req["outputs"], f"{name}.{i}.npy")
                    np.save(path, np.asarray(o))
                    paths.append(path)
                methods[name], inputs[name] = method, xs
                ans = {"outputs": paths}
            elif op == "time":
                method, xs = methods[req["name"]], inputs[req["name"]]
                for _ in range(int(req.get("warmup", 0))):
                    method(xs)
                times = []
                for _ in range(int(req["n"])):
                    t0 = time.perf_counter()
                    method(xs)
                    times.append(time.perf_counter() - t0)
                ans = {"times": times}
            elif op == "drop":
                methods.pop(req["name"], None)
                inputs.pop(req["name"], None)
                ans = {}
            else:
                ans = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # reported to the parent, which raises it with the request
            ans = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        answers.write(json.dumps(ans) + "\n")


if __name__ == "__main__":
    main()
