"""Loading Qualcomm's libraries and their function tables (once per process and path)."""

from __future__ import annotations

import ctypes as C
import os
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeport_qnn.sdk import abi
from edgeport_qnn.sdk.errors import QnnError
from edgeport_qnn.sdk.interface import (
    BACKEND_PROTOTYPES,
    SYSTEM_PROTOTYPES,
    BackendProvider,
    GetBackendProviders,
    GetSystemProviders,
    SystemProvider,
    bind,
)

_LOCK = threading.Lock()
_BACKENDS: dict[Path, FunctionTable] = {}
_SYSTEMS: dict[Path, FunctionTable] = {}


@contextmanager
def _stdout_to_stderr():
    """While Qualcomm's libraries initialise they write a banner to file descriptor 1; keep stdout (which may
    carry a program's data) clean by pointing fd 1 at stderr for the duration of the load."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class FunctionTable:
    """A loaded library's chosen provider and its typed entries."""

    def __init__(self, path: Path, library: C.CDLL, provider: Any, prototypes: dict[str, type]) -> None:
        self.path = path
        self.library = library  # never unloaded: QNN libraries do not support being dlclose()d and reloaded
        self.provider = provider
        self._prototypes = prototypes
        self._bound: dict[str, Callable[..., int]] = {}

    def __getattr__(self, name: str) -> Callable[..., int]:
        if name.startswith("_"):
            raise AttributeError(name)
        fn = self._bound.get(name)
        if fn is None:
            if name not in self._prototypes:
                raise AttributeError(f"no prototype declared for QNN entry {name!r}")
            fn = bind(self.provider.table, self._prototypes, name)
            if fn is None:
                raise QnnError(f"{self.path.name} does not implement {name}")
            self._bound[name] = fn
        return fn


def _open(path: Path) -> C.CDLL:
    try:
        with _stdout_to_stderr():
            return C.CDLL(str(path), mode=C.RTLD_LOCAL)
    except OSError as exc:
        raise QnnError(f"cannot load {path}", detail=str(exc)) from exc


def _providers(get: Any, provider_type: type) -> list[Any]:
    plist = C.POINTER(C.POINTER(provider_type))()
    count = C.c_uint32()
    status = get(C.byref(plist), C.byref(count))
    if abi.error_code(status) != abi.SUCCESS:
        raise QnnError("getProviders failed", abi.error_code(status))
    if not plist or not 0 < count.value < 64:
        raise QnnError(f"getProviders returned {count.value} providers")
    return [plist[i].contents for i in range(count.value) if plist[i]]


def backend_table(path: Path) -> FunctionTable:
    """The backend interface of the QNN backend library at ``path`` (core API major version 2)."""
    path = Path(path).resolve()
    with _LOCK:
        table = _BACKENDS.get(path)
        if table is None:
            library = _open(path)
            try:
                get = GetBackendProviders(("QnnInterface_getProviders", library))
            except AttributeError as exc:
                raise QnnError(f"{path} is not a QNN backend library (no QnnInterface_getProviders)") from exc
            usable = [p for p in _providers(get, BackendProvider) if p.api_version.core.major == abi.API_MAJOR]
            if not usable:
                raise QnnError(f"{path} offers no provider of QNN core API {abi.API_MAJOR}.x")
            provider = max(usable, key=lambda p: p.api_version.core.minor)
            table = _BACKENDS[path] = FunctionTable(path, library, provider, BACKEND_PROTOTYPES)
        return table


def system_table(path: Path) -> FunctionTable:
    """The system interface of ``libQnnSystem.so`` at ``path`` (context-binary introspection)."""
    path = Path(path).resolve()
    with _LOCK:
        table = _SYSTEMS.get(path)
        if table is None:
            library = _open(path)
            try:
                get = GetSystemProviders(("QnnSystemInterface_getProviders", library))
            except AttributeError as exc:
                raise QnnError(f"{path} is not the QNN system library") from exc
            usable = [p for p in _providers(get, SystemProvider) if p.api_version.major == 1]
            if not usable:
                raise QnnError(f"{path} offers no QNN system API 1.x provider")
            provider = max(usable, key=lambda p: p.api_version.minor)
            table = _SYSTEMS[path] = FunctionTable(path, library, provider, SYSTEM_PROTOTYPES)
        return table
