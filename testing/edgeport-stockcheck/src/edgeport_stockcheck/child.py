"""The child process of ``edgeport.testing.stock_runtime``: runs pickled cases on the stock ExecuTorch runtime.

``python -m edgeport_stockcheck.child WORK START`` loads ``WORK/cases.pkl`` (``(name, pte path, method, inputs,
ptd path[, steps[, etdump path]])`` tuples; with an ETDump path, the program is loaded with profiling on and its
ETDump written there after the run; with ``steps`` true, ``inputs`` is a list of input lists executed in order on one
loaded method, and the outputs are one list per step), runs them from index ``START`` on ``executorch.runtime`` (programs loaded from files, i.e.
memory-mapped as on a device) and appends a length-prefixed pickled record per event to ``WORK/report.bin``:
``("start", i)`` before a case and ``("done", i, outputs, error)`` after it, so the parent knows which case was
running when the process dies. Test-only: this is the one place that imports ``executorch``.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any

import numpy as np
import torch
from executorch.runtime import Runtime, Verification

try:  # ExecuTorch's LLM kernels (llama::sdpa_with_kv_cache, update_cache, custom_sdpa), as its own runner loads them
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
except Exception:  # noqa: BLE001 - a wheel without them still runs every other program
    pass


def _as_input(v: Any) -> Any:
    return torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v


def _as_output(v: Any) -> Any:
    return v.detach().numpy().copy() if isinstance(v, torch.Tensor) else v


def main(work: str, start: int) -> None:
    with open(os.path.join(work, "cases.pkl"), "rb") as f:
        cases = pickle.load(f)
    runtime = Runtime.get()
    with open(os.path.join(work, "report.bin"), "ab", buffering=0) as report:

        def emit(obj: Any) -> None:
            data = pickle.dumps(obj)
            report.write(struct.pack("<Q", len(data)) + data)

        for index in range(start, len(cases)):
            _name, path, method, inputs, data_path, *rest = cases[index]
            steps = bool(rest and rest[0])  # a sequence of executes on one loaded method (stateful programs)
            etdump = rest[1] if len(rest) > 1 else None  # profile: write the ETDump to this path
            emit(("start", index))
            try:
                program = runtime.load_program(path, verification=Verification.InternalConsistency,
                                               data_path=data_path, enable_etdump=etdump is not None)
                loaded = program.load_method(method)
                if steps:
                    result = [[_as_output(v) for v in loaded.execute([_as_input(v) for v in step])]
                              for step in inputs]
                else:
                    result = [_as_output(v) for v in loaded.execute([_as_input(v) for v in inputs])]
                if etdump is not None:
                    program.write_etdump_result_to_file(etdump, etdump + ".debug")
                emit(("done", index, result, None))
            except Exception as exc:  # noqa: BLE001 - reported to the parent as the case's error
                emit(("done", index, None, f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
