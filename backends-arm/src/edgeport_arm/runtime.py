"""Executors of the Arm backends: TOSA graphs run on Arm's TOSA reference model (``tosa_reference_model``).

``TOSABackend`` delegates hold a TOSA flatbuffer. ``EthosUBackend`` delegates hold Vela's command stream, which
needs an Ethos-U NPU (or Arm's FVP); the program also carries the partition's TOSA graph as named data
(:func:`~edgeport_arm.keys.tosa_key`, ignored by ExecuTorch's runtime), and this executor runs that graph on the reference model --
the method profile says so (``DelegateInfo.execution``): reference execution, not NPU execution.

Every blob is checked by :func:`~edgeport_arm.schema.tosa_reader.read_tosa` before the reference model sees it;
inputs are checked against the graph's declared types and shapes. The reference model writes warnings to the
process's stdout/stderr from native code; they are captured (file-descriptor level) and attached to errors.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_arm.keys import tosa_key
from edgeport_arm.options import ETHOSU_BACKEND_ID, TOSA_BACKEND_ID
from edgeport_arm.schema.tosa_reader import TosaGraphInfo, read_tosa

_NUMPY = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "float32": np.float32, "bool": np.bool_}
_FD_LOCK = threading.Lock()


@contextlib.contextmanager
def _captured_native_output() -> Iterator[list[str]]:
    """Redirect fds 1 and 2 to a temporary file while native code runs; yields a list that receives the text."""
    sink: list[str] = []
    with _FD_LOCK, tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield sink
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


@dataclass
class _Handle:
    blob: bytes
    info: TosaGraphInfo
    backend_id: str


class TosaReferenceExecutor:
    """Runs a TOSA graph with ``tosa_reference_model.run`` (one call per execution)."""

    thread_safe = True

    def __init__(self, backend_id: str = TOSA_BACKEND_ID) -> None:
        self.backend_id = backend_id

    def is_available(self) -> tuple[bool, str]:
        try:
            import tosa_reference_model  # noqa: F401
        except ImportError as exc:
            return False, f"the TOSA reference model is not installed (pip install tosa-tools): {exc}"
        return True, ""

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec],
             named_data: Callable[[str], memoryview] | None = None) -> _Handle:
        if self.backend_id == ETHOSU_BACKEND_ID:
            blob = self._carried_tosa(processed, named_data)
        else:
            blob = bytes(processed)
        info = read_tosa(blob, f"{self.backend_id} delegate")
        for t in (*info.inputs, *info.outputs):
            if t.dtype_name not in _NUMPY:
                raise ProgramError(f"{self.backend_id}: graph tensor {t.name!r} has type {t.dtype_name}, which this "
                                   "executor does not exchange with the runtime")
        return _Handle(blob, info, self.backend_id)

    def _carried_tosa(self, processed: memoryview, named_data: Callable[[str], memoryview] | None) -> bytes:
        from edgeport_arm.schema.vela_stream import parse_vela_stream

        parse_vela_stream(processed)  # a damaged stream is refused even though it is not executed here
        key = tosa_key(processed)
        if named_data is None:
            raise ProgramError(f"{ETHOSU_BACKEND_ID}: the runtime gave no named data; cannot find the TOSA graph")
        try:
            return bytes(named_data(key))
        except (KeyError, ProgramError) as exc:
            raise ProgramError(
                f"{ETHOSU_BACKEND_ID}: the program carries no TOSA graph for this delegate (named data {key!r}), so "
                "it can only run on an Ethos-U NPU; lower it with edgeport-arm to run it here on the reference "
                f"model ({exc})") from None

    def describe_execution(self, handle: _Handle) -> str:
        if handle.backend_id == ETHOSU_BACKEND_ID:
            return ("reference execution: the partition's TOSA graph on Arm's TOSA reference model, not the "
                    "Ethos-U NPU (its Vela command stream needs the NPU or an FVP)")
        return "Arm's TOSA reference model (tosa-tools)"

    def num_outputs(self, handle: _Handle) -> int:
        return len(handle.info.outputs)

    def execute(self, handle: _Handle, inputs: Sequence[Any]) -> list[np.ndarray]:
        import tosa_reference_model as rm

        info = handle.info
        if len(inputs) != len(info.inputs):
            raise RuntimeExecutionError(f"{handle.backend_id}: {len(inputs)} inputs given, the graph takes "
                                        f"{len(info.inputs)}")
        arrays = []
        for i, (x, t) in enumerate(zip(inputs, info.inputs, strict=True)):
            a = np.asarray(x)
            want = _NUMPY[t.dtype_name]
            if a.dtype != want or tuple(a.shape) != t.shape:
                raise RuntimeExecutionError(f"{handle.backend_id}: input {i} must be {t.dtype_name} of shape "
                                            f"{list(t.shape)}, got {a.dtype} {list(a.shape)}")
            arrays.append(np.ascontiguousarray(a))
        try:
            with _captured_native_output() as log:
                outs, status = rm.run(handle.blob, arrays)
        except (ValueError, RuntimeError) as exc:  # the reference model's own checks of the graph
            raise RuntimeExecutionError(f"{handle.backend_id}: the TOSA reference model refused the graph: {exc}: "
                                        f"{''.join(log).strip()[-2000:]}") from None
        if getattr(status, "name", str(status)) != "TOSA_VALID":
            raise RuntimeExecutionError(f"{handle.backend_id}: the TOSA reference model returned {status}: "
                                        f"{''.join(log).strip()[-2000:]}")
        results = []
        for o, t in zip(outs, info.outputs, strict=True):
            a = np.asarray(o)
            want = _NUMPY[t.dtype_name]
            if a.dtype != want:
                a = a.view(want) if a.dtype.itemsize == 1 and a.size == np.prod(t.shape) * np.dtype(want).itemsize \
                    else a.astype(want)
            results.append(a.reshape(t.shape))
        return results

    def destroy(self, handle: _Handle) -> None:
        return None
