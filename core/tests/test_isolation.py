"""edgeport.isolation: a crash in the worker is an exception in the caller, and the worker comes back.

The functions run in the worker are importable ones (the test modules are imported with pytest's importlib
mode, so the worker could not import functions defined here): ``ctypes.string_at(0)`` reads address 0
(SIGSEGV), ``os.abort`` raises SIGABRT, ``operator.truediv(1, 0)`` raises ZeroDivisionError.
"""

from __future__ import annotations

import ctypes
import operator
import os
import pickle
import textwrap
import time

import pytest

from edgeport.errors import LoweringError
from edgeport.isolation import IsolatedWorker, RemoteTraceback, WorkerCrashed, get_worker


@pytest.fixture
def worker():
    w = IsolatedWorker("test")
    yield w
    w.close()


def test_results_round_trip_and_worker_is_reused(worker):
    assert worker.call(divmod, 17, 5) == (3, 2)
    pid = worker.call(os.getpid)
    assert pid != os.getpid()
    assert worker.call(sorted, [3, 1, 2], reverse=True) == [3, 2, 1]
    assert worker.call(os.getpid) == pid


def test_exceptions_keep_their_type_and_carry_the_worker_traceback(worker):
    with pytest.raises(ZeroDivisionError) as info:
        worker.call(operator.truediv, 1, 0)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "ZeroDivisionError" in str(info.value.__cause__)
    with pytest.raises(KeyError):
        worker.call(operator.getitem, {}, "missing")
    assert worker.call(operator.add, 2, 3) == 5  # the worker survived


def test_sigsegv_raises_worker_crashed_and_next_call_starts_a_new_worker(worker):
    first = worker.call(os.getpid)
    with pytest.raises(WorkerCrashed) as info:
        worker.call(ctypes.string_at, 0)
    err = info.value
    assert isinstance(err, LoweringError)
    assert err.signal == "SIGSEGV" and err.exitcode == -11 and err.worker_name == "test"
    assert "SIGSEGV" in str(err) and "Fatal Python error" in err.detail  # faulthandler's stack
    second = worker.call(os.getpid)
    assert second != first
    assert worker.call(divmod, 7, 2) == (3, 1)


def test_abort_and_nonzero_exit(worker):
    with pytest.raises(WorkerCrashed) as info:
        worker.call(os.abort)
    assert info.value.signal == "SIGABRT"
    with pytest.raises(WorkerCrashed) as info:
        worker.call(os._exit, 3)
    assert info.value.signal is None and info.value.exitcode == 3
    assert worker.call(abs, -4) == 4


def test_timeout_kills_the_worker(worker):
    with pytest.raises(WorkerCrashed, match="no answer within 0.5 s") as info:
        worker.call(time.sleep, 30, timeout=0.5)
    assert info.value.signal == "SIGKILL"
    assert worker.call(abs, -1) == 1


def test_unpicklable_input_fails_in_the_caller_and_unpicklable_exception_becomes_runtime_error(worker, tmp_path,
                                                                                                 monkeypatch):
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        worker.call(lambda: 1)
    # a module on the caller's sys.path reaches the worker (sys.path goes with every call)
    (tmp_path / "planted_mod.py").write_text(textwrap.dedent("""
        import threading
        class Odd(Exception):
            def __init__(self, a, b):
                super().__init__(a)
                self.b = b
        def raise_odd():
            raise Odd("odd one", 2)
        def unpicklable_result():
            return threading.Lock()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import planted_mod

    with pytest.raises(RuntimeError, match="Odd: odd one"):
        worker.call(planted_mod.raise_odd)
    with pytest.raises(RuntimeError, match="could not be pickled"):
        worker.call(planted_mod.unpicklable_result)


def test_env_reaches_the_worker_and_get_worker_shares():
    w = get_worker("test-isolation-env", env={"EDGEPORT_ISOLATION_TEST": "42"})
    assert get_worker("test-isolation-env") is w
    assert w.call(os.getenv, "EDGEPORT_ISOLATION_TEST") == "42"
    with pytest.raises(ValueError, match="already exists"):
        get_worker("test-isolation-env", env={"EDGEPORT_ISOLATION_TEST": "43"})
    w.close()
    assert w.pid is None
    with pytest.raises(ValueError, match="start_method"):
        IsolatedWorker("x", start_method="fork")
