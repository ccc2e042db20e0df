"""Run Arm's Vela compiler in-process on a TOSA flatbuffer: the Ethos-U command stream plus Vela's estimates.

Torch-free; ``ethosu.vela`` is imported only when a function needs it, so importing this module is cheap.
Vela's output (Python prints and its C++ core's writes to file descriptors 1 and 2) is captured into
:attr:`VelaResult.log`, never printed. :func:`compile_tosa_isolated` (what the backend uses) runs
:func:`compile_tosa` in an :mod:`edgeport.isolation` worker, so a crash of Vela's native core (SIGSEGV, abort)
becomes a :class:`VelaCrashed` error instead of ending the caller's process; its results are cached per input. Every failure becomes a :class:`VelaError` naming the partition and
target with Vela's own message. Compilations are serialised by a lock because capturing file descriptors and
Vela's ``sys.setrecursionlimit`` are process-wide (output other threads write to file descriptors 1 and 2
while Vela runs lands in the log too).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import os
import re
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from edgeport_arm.options import ETHOSU_TARGETS, default_system_config
from edgeport_arm.schema.vela_stream import VelaStream, VelaStreamError, from_vela_npz, pack_vela_stream

__all__ = [
    "ACCELERATORS", "VelaCrashed", "VelaError", "VelaEstimates", "VelaResult", "compile_tosa",
    "compile_tosa_isolated", "default_system_config", "vela_version",
]

#: Vela's accelerator configurations (``--accelerator-config``).
ACCELERATORS = ETHOSU_TARGETS
# Flags compile_tosa sets itself; pass their values through its keyword arguments instead.
_MANAGED_FLAGS = {
    "--accelerator-config": "target", "--config": "config_ini", "--output-format": None,
    "--system-config": "system_config", "--memory-mode": "memory_mode", "--output-dir": None,
}
_TOSA_IDENTIFIER = b"TOSA"
_MODEL_STEM = "model"
_OPS_RE = re.compile(r"^\s*(CPU|NPU) operators = (\d+)\b", re.MULTILINE)
_LOCK = threading.Lock()
_UNSUPPORTED_MARKERS = ("not supported", "could not run on NPU")
_UNSUPPORTED_HINT = ("\n(The Ethos-U NPU runs quantized TOSA INT graphs and not every operator on every target: "
                     "quantize the model, or keep the operators Vela names out of this partition.)")


class VelaError(RuntimeError):
    """Vela could not compile a partition (or placed part of it on the CPU)."""


class VelaCrashed(VelaError):
    """Vela's process died compiling a partition (``signal``: e.g. ``"SIGSEGV"``, or ``None`` for an exit)."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.signal = signal

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.signal))


def _check_target(target: str) -> str:
    norm = target.strip().lower() if isinstance(target, str) else target
    if norm not in ACCELERATORS:
        raise ValueError(f"unknown Ethos-U target {target!r}; valid targets: {', '.join(ACCELERATORS)}")
    return norm


def vela_version() -> str:
    """The installed Vela's version, e.g. ``"5.2.0"``."""
    from ethosu.vela._version import __version__

    return str(__version__)


@dataclass(frozen=True)
class VelaEstimates:
    """Vela's performance and memory estimates for one compiled partition (from its summary CSV and log)."""

    accelerator: str
    system_config: str
    memory_mode: str
    cycles_npu: float
    cycles_total: float
    inference_time_s: float
    sram_used_kib: float
    off_chip_flash_used_kib: float
    dram_used_kib: float
    on_chip_flash_used_kib: float
    macs: int
    npu_ops: int
    cpu_ops: int
    original_weight_bytes: int
    encoded_weight_bytes: int
    per_layer: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of all fields (``per_layer`` as a list of dicts)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "per_layer"}
        out["per_layer"] = [dict(row) for row in self.per_layer]
        return out


@dataclass(frozen=True)
class VelaResult:
    """A compiled partition: the decoded stream, its packed bytes (the delegate blob), estimates and log."""

    stream: VelaStream
    blob: bytes
    estimates: VelaEstimates
    log: str


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C runtime reachable this way (e.g. Windows)
        pass


class _Capture:
    text = ""


@contextlib.contextmanager
def _captured_output() -> Iterator[_Capture]:
    """Capture Python's ``sys.stdout``/``sys.stderr`` and the process's file descriptors 1 and 2."""
    cap = _Capture()
    py_out = io.StringIO()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _flush_c_stdio()
    saved: list[tuple[int, int]] = []
    with tempfile.TemporaryFile() as native:
        try:
            for fd in (1, 2):
                try:
                    saved.append((fd, os.dup(fd)))
                except OSError:  # descriptor closed: nothing to capture there
                    continue
                os.dup2(native.fileno(), fd)
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_out):
                yield cap
        finally:
            _flush_c_stdio()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            native.seek(0)
            native_text = native.read().decode("utf-8", errors="replace")
            cap.text = "\n".join(t.rstrip("\n") for t in (native_text, py_out.getvalue()) if t.strip()) + "\n"


def _tail(log: str, lines: int = 12) -> str:
    kept = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(kept) if "error" in ln.lower()]
    if errors:  # start at Vela's first error line (skips e.g. argparse's usage text)
        kept = kept[errors[0]:]
    return "\n".join(kept[-lines:]) if kept else "(Vela printed nothing)"


def _exception_text(exc: BaseException) -> str:
    text = getattr(exc, "error_msg", None) or getattr(exc, "data", None) or str(exc)
    return f"{type(exc).__name__}: {str(text).strip()}"


def _check_tosa(blob: Any, partition: str, target: str) -> bytes:
    try:
        data = bytes(blob)
    except TypeError:
        raise VelaError(f"partition {partition!r} ({target}): the TOSA flatbuffer must be bytes, "
                        f"got {type(blob).__name__}") from None
    if not data:
        raise VelaError(f"partition {partition!r} ({target}): the TOSA flatbuffer is empty; lower the "
                        "partition to TOSA first")
    if len(data) < 12 or data[4:8] != _TOSA_IDENTIFIER:
        raise VelaError(f"partition {partition!r} ({target}): input is not a TOSA flatbuffer (no 'TOSA' file "
                        f"identifier at bytes 4..8, got {data[4:8]!r}); pass the serialized TOSA graph")
    root = int.from_bytes(data[:4], "little")
    if root < 8 or root + 4 > len(data):
        raise VelaError(f"partition {partition!r} ({target}): TOSA flatbuffer root offset {root} lies outside the "
                        f"{len(data)}-byte buffer (truncated?)")
    return data


def _split_flags(extra_flags: Sequence[str]) -> list[str]:
    if isinstance(extra_flags, str | bytes):
        raise TypeError("extra_flags must be a sequence of flags, not a single string")
    flags: list[str] = []
    for flag in extra_flags:
        if not isinstance(flag, str):
            raise TypeError(f"extra_flags items must be str, got {type(flag).__name__}")
        flags.extend(flag.split())  # ExecuTorch joins and re-splits its flags on spaces; do the same
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in _MANAGED_FLAGS:
            via = _MANAGED_FLAGS[name]
            how = f"use compile_tosa's {via}= argument" if via else "compile_tosa sets it itself"
            raise ValueError(f"extra_flags may not contain {name} ({how})")
    return flags


def _number(text: str) -> int | float | str:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _read_summary(path: str) -> dict[str, str]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or len(rows[1]) != len(rows[0]):
        raise ValueError(f"unexpected layout of Vela's summary CSV {os.path.basename(path)}")
    return dict(zip(rows[0], rows[1]))


def _read_per_layer(path: str) -> tuple[dict[str, Any], ...]:
    if not os.path.exists(path):
        return ()
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r]
    if not rows:
        return ()
    header, out = rows[0], []
    for row in rows[1:]:
        if len(row) > len(header):  # Vela joins with "," unquoted: a comma in the last (Name) column splits it
            row = row[:len(header) - 1] + [",".join(row[len(header) - 1:])]
        out.append({k: _number(v) for k, v in zip(header, row)})
    return tuple(out)


def _estimates(summary: dict[str, str], log: str, per_layer: tuple[dict[str, Any], ...]) -> VelaEstimates:
    def num(key: str) -> float:
        value = float(summary[key])
        if math.isnan(value):
            raise ValueError(f"{key} is NaN")
        return value

    def whole(key: str) -> int:
        value = num(key)
        if not value.is_integer():
            raise ValueError(f"{key} = {value} is not a whole number")
        return int(value)

    ops = {kind: int(n) for kind, n in _OPS_RE.findall(log)}
    if set(ops) != {"CPU", "NPU"}:
        raise ValueError("Vela's output has no 'CPU operators = N' / 'NPU operators = N' summary lines")
    return VelaEstimates(
        accelerator=summary["accelerator_configuration"],
        system_config=summary["system_config"],
        memory_mode=summary["memory_mode"],
        cycles_npu=num("cycles_npu"),
        cycles_total=num("cycles_total"),
        inference_time_s=num("inference_time"),
        sram_used_kib=num("sram_memory_used"),
        off_chip_flash_used_kib=num("off_chip_flash_memory_used"),
        dram_used_kib=num("dram_memory_used"),
        on_chip_flash_used_kib=num("on_chip_flash_memory_used"),
        macs=whole("nn_macs"),
        npu_ops=ops["NPU"],
        cpu_ops=ops["CPU"],
        original_weight_bytes=whole("total_original_weights"),
        encoded_weight_bytes=whole("total_npu_encoded_weights"),
        per_layer=per_layer,
    )


def _run_vela(argv: list[str]) -> tuple[int | str | None, BaseException | None, str]:
    """Call ``vela.main(argv)``; returns (exit code, exception, captured output)."""
    from ethosu.vela import vela

    code: int | str | None = None
    error: BaseException | None = None
    limit = sys.getrecursionlimit()
    with _LOCK:
        try:
            with _captured_output() as cap:
                try:
                    code = vela.main(argv)
                except SystemExit as e:
                    code = e.code if e.code is not None else 0
                except Exception as e:  # anything from inside Vela: reported with its own message
                    error = e
        finally:
            sys.setrecursionlimit(limit)  # Vela sets its own limit; restore the caller's
    return code, error, cap.text


def compile_tosa(
    tosa_flatbuffer: bytes,
    *,
    target: str,
    system_config: str | None = None,
    memory_mode: str | None = None,
    extra_flags: Sequence[str] = (),
    config_ini: str = "Arm/vela.ini",
    partition_name: str = "partition",
) -> VelaResult:
    """Compile a TOSA 1.0 INT graph for ``target`` with Vela (``--output-format=raw``).

    ``system_config`` / ``memory_mode`` default per family as in :func:`default_system_config`. Raises
    ``ValueError`` for an unknown target or a flag this function manages, and :class:`VelaError` if the input
    is not TOSA, Vela fails, or Vela leaves any operator to the CPU (the backend never falls back silently).
    Per-layer estimates are filled in when ``extra_flags`` asks Vela for them (``--verbose-performance``).
    """
    target = _check_target(target)
    default_sc, default_mm = default_system_config(target)  # ExecuTorch's defaults per family
    system_config = default_sc if system_config is None else system_config
    memory_mode = default_mm if memory_mode is None else memory_mode
    flags = _split_flags(extra_flags)
    where = f"partition {partition_name!r} for {target}"
    data = _check_tosa(tosa_flatbuffer, partition_name, target)

    with tempfile.TemporaryDirectory(prefix="edgeport-vela-") as tmp:
        tosa_path = os.path.join(tmp, f"{_MODEL_STEM}.tosa")
        out_dir = os.path.join(tmp, "output")
        with open(tosa_path, "wb") as f:
            f.write(data)
        argv = [
            *flags,
            f"--accelerator-config={target}",
            f"--config={config_ini}",
            "--output-format=raw",
            f"--system-config={system_config}",
            f"--memory-mode={memory_mode}",
            f"--output-dir={out_dir}",
            tosa_path,
        ]
        try:
            code, error, log = _run_vela(argv)
        except OSError as e:  # capturing Vela's output failed
            raise VelaError(f"could not run Vela for {where}: {e}") from e
        if error is not None:
            text = _exception_text(error)
            hint = _UNSUPPORTED_HINT if any(m in text for m in _UNSUPPORTED_MARKERS) else ""
            tail = f"\nVela's last output:\n{_tail(log)}" if log.strip() else ""
            raise VelaError(f"Vela could not compile {where}: {text}{hint}{tail}") from None
        if code not in (0, None):
            raise VelaError(f"Vela could not compile {where} (exit status {code}):\n{_tail(log)}")
        npz_path = os.path.join(out_dir, f"{_MODEL_STEM}_vela.npz")
        if not os.path.exists(npz_path):
            raise VelaError(f"Vela wrote no command stream for {where} (did extra_flags ask for a report "
                            f"instead of a compilation?):\n{_tail(log)}")
        try:
            stream = from_vela_npz(npz_path)
            summary = _read_summary(os.path.join(out_dir, f"{_MODEL_STEM}_summary_{system_config}.csv"))
            per_layer = _read_per_layer(os.path.join(out_dir, f"{_MODEL_STEM}_per-layer.csv"))
            estimates = _estimates(summary, log, per_layer)
        except (VelaStreamError, OSError, ValueError, KeyError) as e:
            raise VelaError(f"cannot read Vela's output for {where}: {e}") from e

    if estimates.cpu_ops:
        raise VelaError(f"the NPU cannot run {estimates.cpu_ops} of the operators of {where}: Vela placed them on "
                        "the CPU, and the Ethos-U backend does not fall back; keep those operators out of the "
                        f"partition.\n{_tail(log)}")
    return VelaResult(stream=stream, blob=pack_vela_stream(stream), estimates=estimates, log=log)


#: key -> result (or the VelaError raised) of recent isolated compilations; see compile_tosa_isolated
_CACHE: OrderedDict[str, VelaResult | VelaError] = OrderedDict()
_CACHE_SIZE = 32
#: seconds an isolated compilation may take before its worker is killed (None: no limit)
ISOLATED_TIMEOUT_S: float | None = 1800.0


def _cache_key(data: bytes, kwargs: dict[str, Any]) -> str:
    h = hashlib.sha256(data)
    h.update(repr(sorted((k, v if isinstance(v, str | None) else tuple(v)) for k, v in kwargs.items()
                         if k != "partition_name")).encode())
    return h.hexdigest()


def compile_tosa_isolated(tosa_flatbuffer: bytes, *, target: str, partition_name: str = "partition",
                          ops: str = "", **kwargs: Any) -> VelaResult:
    """:func:`compile_tosa` in the shared ``"vela"`` worker process (:func:`edgeport.isolation.get_worker`).

    Same arguments and errors; in addition a crash of the worker raises :class:`VelaCrashed` naming the
    partition, ``ops`` (a description of its operators, for the message) and the signal, and the next call
    starts a new worker. Results and Vela's refusals are cached by input bytes and options, so compiling a
    partition the partitioner already test-compiled costs nothing. ``EDGEPORT_ARM_VELA_IN_PROCESS=1`` runs
    Vela in this process instead (no protection; for debugging and measuring).
    """
    from edgeport.isolation import WorkerCrashed, get_worker

    data = _check_tosa(tosa_flatbuffer, partition_name, target)
    key = _cache_key(data, {"target": target, **kwargs})
    hit = _CACHE.get(key)
    if hit is None:
        try:
            if os.environ.get("EDGEPORT_ARM_VELA_IN_PROCESS") == "1":
                hit = compile_tosa(data, target=target, partition_name=partition_name, **kwargs)
            else:
                hit = get_worker("vela").call(compile_tosa, data, target=target, partition_name=partition_name,
                                              timeout=ISOLATED_TIMEOUT_S, **kwargs)
        except VelaError as exc:
            hit = exc
        except WorkerCrashed as exc:
            what = f" ({ops})" if ops else ""
            hit = VelaCrashed(f"Vela crashed compiling partition {partition_name!r}{what} for {target}: {exc}",
                              exc.signal)
        _CACHE[key] = hit
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    if isinstance(hit, VelaError):
        raise type(hit)(*hit.__reduce__()[1]) if isinstance(hit, VelaCrashed) else VelaError(str(hit))
    return hit
