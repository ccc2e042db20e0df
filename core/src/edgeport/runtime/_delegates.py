"""Delegates of a method, initialised at load: each on its backend's executor, or, with ``allow_fallback``, on
the portable fallback method the program carries for it.

Delegate handles are shared by all runs and called under a per-delegate lock unless the executor declares
``thread_safe = True`` (see :mod:`edgeport.runtime._compile`).
"""

from __future__ import annotations

import inspect
import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeport.errors import BackendNotFoundError, EdgeportError, ProgramError
from edgeport.program import schema as S
from edgeport.runtime._profile import DelegateInfo, MethodProfile

__all__ = ["FALLBACK_COMPILE_SPEC", "Delegate", "Delegates"]

_log = logging.getLogger("edgeport.runtime")

#: Compile-spec key a delegate carries to name a method of the same program that computes the same partition
#: with portable kernels (inputs = the delegate's inputs, outputs = its outputs). Used with ``allow_fallback``.
FALLBACK_COMPILE_SPEC = "edgeport.portable_fallback"


@dataclass
class Delegate:
    """An initialised delegate: a backend executor and its handle, or the fallback method's runner."""

    kind: str  # "backend" or "fallback"
    backend_id: str
    executor: Any  # the backend's executor; for a fallback, the fallback method's MethodRunner
    handle: Any = None
    lock: threading.Lock | None = None
    takes_out: bool = False  # ``execute`` accepts ``out=`` (destination passing, see RuntimeExecutor)


def _accepts_named_data(init: Callable[..., Any]) -> bool:
    """Whether an executor's ``init`` takes ``named_data=`` (a ``key -> memoryview`` lookup into the program's
    named data, where ExecuTorch-style blobs keep their weights)."""
    try:
        params = inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False
    return "named_data" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def _accepts_runtime_options(init: Callable[..., Any]) -> bool:
    """Whether an executor's ``init`` declares ``runtime_options`` (by name: a bare ``**kwargs`` does not count)."""
    try:
        p = inspect.signature(init).parameters.get("runtime_options")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _accepts_out(execute: Callable[..., Any]) -> bool:
    """Whether an executor's ``execute`` declares a keyword parameter ``out`` (the planned output arrays to write
    into). A bare ``**kwargs`` does not count: the executor must opt in by name."""
    try:
        p = inspect.signature(execute).parameters.get("out")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _fallback_name(d: S.BackendDelegate) -> str | None:
    for cs in d.compile_specs:
        if cs.key == FALLBACK_COMPILE_SPEC:
            try:
                return bytes(cs.value).decode()
            except UnicodeDecodeError:
                return None
    return None


class Delegates:
    """The delegates of one method, initialised at load; :meth:`destroy` releases their handles.

    ``load_fallback(delegate_index, method_name)`` loads a portable fallback method and returns its runner.
    """

    def __init__(self, where: str, profile: MethodProfile, allow_fallback: bool,
                 load_fallback: Callable[[int, str], Any], backend_options: dict[str, Any] | None = None) -> None:
        self.where = where
        self.profile = profile
        self.allow_fallback = allow_fallback
        self.load_fallback = load_fallback
        self.backend_options = backend_options or {}  # backend id -> its RuntimeOptions (already validated)
        self.items: list[Delegate] = []
        self._handles: list[tuple[Any, Any]] = []  # (executor, handle) to destroy
        self._fallbacks: list[Any] = []  # runners of fallback methods

    def init_all(self, lp: Any, plan_index: int) -> None:
        for di, d in enumerate(lp.program.execution_plan[plan_index].delegates):
            self.items.append(self._init_delegate(lp, plan_index, di, d))

    def _init_delegate(self, lp: Any, plan_index: int, di: int, d: S.BackendDelegate) -> Delegate:
        from edgeport.registry import backend_not_found_message, get_backend

        at = f"{self.where} delegates[{di}] (backend {d.id!r})"
        reason = ""
        spec = None
        try:
            spec = get_backend(d.id)
        except BackendNotFoundError:
            reason = backend_not_found_message(d.id)
        executor = None
        if spec is not None:
            try:
                ok, why = spec.is_available()
            except Exception as exc:  # noqa: BLE001 - a broken availability probe means unavailable
                ok, why = False, f"is_available raised {type(exc).__name__}: {exc}"
            if ok and spec.executor is None:
                ok, why = False, "the backend registers no runtime executor"
            if ok:
                executor = spec.executor()
                try:
                    ok, why = executor.is_available()
                except AttributeError:
                    ok, why = True, ""
            if not ok:
                reason = f"backend {d.id!r} is installed but unavailable: {why}"
                executor = None
        if executor is None:
            fallback = _fallback_name(d)
            if self.allow_fallback and fallback is not None:
                return self._init_fallback(di, d, fallback, reason)
            hint = ""
            if fallback is not None:
                hint = (f"; the program carries a portable fallback ({fallback!r}): load_method(..., "
                        "allow_fallback=True), i.e. on_backend_unavailable='portable'")
            elif self.allow_fallback:
                hint = "; the program carries no portable fallback for this delegate"
            raise BackendNotFoundError(f"{at}: {reason}{hint}")
        processed = lp.delegate_data(plan_index, di)
        kwargs: dict[str, Any] = {"named_data": lp.named_data} if _accepts_named_data(executor.init) else {}
        options = self.backend_options.get(d.id)
        if options is not None:
            if not _accepts_runtime_options(executor.init):
                raise BackendNotFoundError(f"{at}: runtime options were given, but the executor's init does not "
                                           "declare a runtime_options parameter (a bug in the backend)")
            kwargs["runtime_options"] = options
        try:
            handle = executor.init(memoryview(processed), list(d.compile_specs), **kwargs)
        except EdgeportError:
            raise
        except Exception as exc:  # noqa: BLE001 - report a bad blob as a program error
            raise ProgramError(f"{at}: executor init failed: {type(exc).__name__}: {exc}") from exc
        self._handles.append((executor, handle))
        describe = getattr(executor, "describe_execution", None)
        execution = str(describe(handle)) if callable(describe) else ""
        self.profile.delegates.append(DelegateInfo(di, d.id, "backend", runtime_options=options, execution=execution))
        lock = None if getattr(executor, "thread_safe", False) else threading.Lock()
        return Delegate("backend", d.id, executor, handle, lock, _accepts_out(executor.execute))

    def _init_fallback(self, di: int, d: S.BackendDelegate, method: str, reason: str) -> Delegate:
        runner = self.load_fallback(di, method)
        self._fallbacks.append(runner)
        self.profile.delegates.append(DelegateInfo(di, d.id, "fallback", reason, method))
        _log.warning("portable fallback: %s delegate %d (%s) runs on %r: %s", self.where, di, d.id, method, reason,
                     extra={"edgeport_event": {"event": "portable_fallback", "where": self.where, "delegate": di,
                                               "backend_id": d.id, "fallback_method": method, "reason": reason}})
        warnings.warn(f"{self.where}: delegate {di} ({d.id}) runs on its portable fallback {method!r}: {reason}",
                      RuntimeWarning, stacklevel=4)
        return Delegate("fallback", d.id, runner)

    def destroy(self) -> None:
        handles, self._handles = self._handles, []
        for executor, handle in handles:
            try:
                executor.destroy(handle)
            except Exception:  # noqa: BLE001,S110 - destroy must not raise during cleanup
                pass
        fallbacks, self._fallbacks = self._fallbacks, []
        for runner in fallbacks:
            runner.plan.destroy()
