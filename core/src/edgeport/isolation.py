"""Run vendor code that can crash (SIGSEGV, abort) in a worker process, so a crash cannot end the caller's.

An :class:`IsolatedWorker` is a Python child process started on first use and reused across calls. The caller
hands it a module-level (picklable) function and its arguments; the result comes back, an exception raised in
the worker is raised again in the caller (same type when it pickles), and a worker that dies raises
:class:`WorkerCrashed` naming the signal; the next call starts a fresh worker.

The worker is a fresh interpreter (``python -c``: like multiprocessing's ``spawn`` no fork of a process holding
torch's threads, unlike it no re-import of the caller's ``__main__``, so unguarded scripts are safe). It inherits
file descriptors 1 and 2, gets the caller's ``sys.path`` with every call, and its faulthandler stack on a fatal
signal becomes :attr:`WorkerCrashed.detail`. :func:`get_worker` keeps one shared worker per key.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Any, TypeVar

from edgeport.errors import LoweringError

__all__ = ["IsolatedWorker", "RemoteTraceback", "WorkerCrashed", "close_all_workers", "get_worker"]

T = TypeVar("T")
_BOOT = "import sys; from edgeport.isolation import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"


class WorkerCrashed(LoweringError):
    """The worker process died (or was killed after a timeout) while running a call."""

    def __init__(self, worker_name: str, signal_name: str | None, exitcode: int | None, detail: str = "") -> None:
        self.worker_name, self.signal, self.exitcode, self.detail = worker_name, signal_name, exitcode, detail
        how = f"killed by {signal_name}" if signal_name else f"exited with code {exitcode}"
        super().__init__(f"isolated worker {worker_name!r} {how}" + (f": {detail}" if detail else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_name, self.signal, self.exitcode, self.detail))


class RemoteTraceback(Exception):
    """The worker-side traceback, attached as ``__cause__`` of an exception re-raised in the caller."""


def _signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _serve(conn_fd: int, fault_fd: int) -> None:
    """The worker's loop: receive ``(sys.path, fn, args, kwargs)`` pickles, answer ``(ok, value, tb_text)``."""
    faulthandler.enable(file=os.fdopen(fault_fd, "w"), all_threads=True)
    conn = Connection(conn_fd)
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not request:
            return
        try:
            path, payload = pickle.loads(request)
            sys.path[:] = path  # before unpickling the function: its module may live on the caller's path
            fn, args, kwargs = pickle.loads(payload)
            reply = (True, fn(*args, **kwargs), "")
        except BaseException as exc:  # noqa: BLE001 - everything the function raises goes back to the caller
            tb = traceback.format_exc()
            try:
                pickle.loads(pickle.dumps(exc))
                reply = (False, exc, tb)
            except Exception:  # noqa: BLE001 - an exception that does not round-trip is sent as text
                reply = (False, RuntimeError(f"{type(exc).__name__}: {exc}"), tb)
        try:
            data = pickle.dumps(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result is reported, not fatal
            data = pickle.dumps((False, RuntimeError(f"result of the call could not be pickled: {exc!r}"), ""))
        conn.send_bytes(data)


class IsolatedWorker:
    """A lazily started child process that runs picklable functions one call at a time (thread-safe)."""

    def __init__(self, name: str, *, env: dict[str, str] | None = None, start_method: str = "spawn") -> None:
        if start_method != "spawn":
            raise ValueError(f"start_method {start_method!r} is not supported; only 'spawn' (a fresh interpreter)")
        self.name = name
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._fault: Any = None

    @property
    def pid(self) -> int | None:
        """The running worker's process id, or ``None`` when none is running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self) -> None:
        parent, child = Pipe(duplex=True)
        self._fault = tempfile.TemporaryFile()
        env = {**os.environ, **self.env}
        fds = (child.fileno(), self._fault.fileno())
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, *map(str, fds)], env=env, pass_fds=fds,
                                          stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            child.close()
        self._conn = parent

    def _reap(self) -> tuple[int | None, str]:
        """Stop tracking the worker (killing it if still alive); its exit code and faulthandler output."""
        proc, conn, fault = self._proc, self._conn, self._fault
        self._proc = self._conn = self._fault = None
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if conn is not None:
            conn.close()
        text = ""
        if fault is not None:
            fault.seek(0)
            text = fault.read().decode("utf-8", errors="replace").strip()
            fault.close()
        return code, text

    def call(self, fn: Callable[..., T], /, *args: Any, timeout: float | None = None, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in the worker and return its result.

        Raises what ``fn`` raised (a ``RuntimeError`` with the text when it does not pickle), and
        :class:`WorkerCrashed` when the worker dies or does not answer within ``timeout`` seconds.
        """
        request = pickle.dumps((list(sys.path), pickle.dumps((fn, args, kwargs))))  # unpicklable input fails here
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    self._reap()
                self._start()
            assert self._conn is not None and self._proc is not None
            try:
                self._conn.send_bytes(request)
                if not self._conn.poll(timeout):
                    self._proc.kill()
                    code, text = self._reap()
                    raise WorkerCrashed(self.name, _signal_name(code), code,
                                        f"no answer within {timeout} s; the worker was killed")
                ok, value, tb = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError, BrokenPipeError):
                code, text = self._reap()
                raise WorkerCrashed(self.name, _signal_name(code), code, text) from None
        if ok:
            return value  # type: ignore[no-any-return]
        if tb:
            value.__cause__ = RemoteTraceback(f"\n--- in isolated worker {self.name!r} ---\n{tb}")
        raise value

    def close(self) -> None:
        """Stop the worker (it is started again by the next :meth:`call`)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send_bytes(b"")  # asks the loop to return
            if self._proc is not None:
                self._reap()


_WORKERS: dict[str, IsolatedWorker] = {}
_WORKERS_LOCK = threading.Lock()


def get_worker(key: str, **kwargs: Any) -> IsolatedWorker:
    """The shared worker for ``key`` (created with ``IsolatedWorker(key, **kwargs)`` on first use).

    Asking again for ``key`` with different keyword arguments raises ``ValueError``. All shared workers are
    closed at interpreter exit.
    """
    with _WORKERS_LOCK:
        worker = _WORKERS.get(key)
        if worker is None:
            worker = _WORKERS[key] = IsolatedWorker(key, **kwargs)
        elif kwargs and (kwargs.get("env") or {}) != worker.env:
            raise ValueError(f"worker {key!r} already exists with env {worker.env!r}, not {kwargs.get('env')!r}")
        return worker


@atexit.register
def close_all_workers() -> None:
    """Close every worker :func:`get_worker` created."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
    for worker in workers:
        worker.close()
