"""What a program needs and what this machine offers: backend requirements, availability and runtime options.

``Program.required_backends()`` lists the backends a program's delegates call, ``edgeport.runtime.backends()``
every registered backend with its availability, and :func:`resolve_backend_options` turns the
``backend_options={"<backend_id>": {...}}`` given to ``load_method`` into each backend's typed
:class:`~edgeport.backend.RuntimeOptions`, refusing what it cannot use before any delegate is initialised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeport.backend import RuntimeOptions
from edgeport.errors import BackendNotFoundError, BackendOptionsError

__all__ = ["BackendStatus", "backend_status", "backends", "resolve_backend_options"]


@dataclass(frozen=True)
class BackendStatus:
    """One backend as this machine sees it (``installed`` False: the program needs it, nothing registers it)."""

    backend_id: str
    installed: bool
    available: bool
    reason: str = ""  # why not available (or not installed: which package to install)
    version: str = ""
    distribution: str | None = None
    runtime_options: tuple[str, ...] = ()  # names of the options load_method(backend_options=...) accepts

    def __str__(self) -> str:
        state = "available" if self.available else f"unavailable: {self.reason}"
        version = f" {self.version}" if self.version else ""
        return f"{self.backend_id}{version}: {state}"


def _probe(spec: Any) -> tuple[bool, str]:
    try:
        ok, why = spec.is_available()
    except Exception as exc:  # noqa: BLE001 - a broken probe means unavailable, with its reason
        return False, f"is_available raised {type(exc).__name__}: {exc}"
    if ok and spec.executor is None:
        return False, "the backend registers no runtime executor"
    return bool(ok), str(why or "")


def _status_of_spec(spec: Any) -> BackendStatus:
    import dataclasses

    ok, why = _probe(spec)
    names = tuple(f.name for f in dataclasses.fields(spec.runtime_options)) if spec.runtime_options else ()
    return BackendStatus(spec.backend_id, True, ok, why, spec.version, spec.distribution, names)


def backend_status(backend_id: str) -> BackendStatus:
    """The status of one backend id, installed or not."""
    from edgeport.registry import backend_not_found_message, get_backend

    try:
        spec = get_backend(backend_id)
    except BackendNotFoundError:
        return BackendStatus(backend_id, False, False, backend_not_found_message(backend_id))
    return _status_of_spec(spec)


def backends() -> list[BackendStatus]:
    """Every registered backend: id, version, available or why not, the runtime options it takes."""
    from edgeport.registry import list_backends

    return [_status_of_spec(spec) for spec in list_backends()]


def resolve_backend_options(given: Mapping[str, Any] | None, used: list[str]) -> dict[str, RuntimeOptions]:
    """``{backend_id: RuntimeOptions}`` from ``load_method``'s ``backend_options``; ``used``: the program's backends.

    Refuses a backend the program does not use, a backend that is not installed or declares no runtime options,
    unknown option names and wrong types (:class:`BackendOptionsError`, listing what is known).
    """
    if not given:
        return {}
    if not isinstance(given, Mapping):
        raise BackendOptionsError(
            f"backend_options must map backend ids to option dicts, e.g. {{'XnnpackBackend': {{'num_threads': 1}}}}; "
            f"got {type(given).__name__}")
    from edgeport.registry import get_backend

    resolved: dict[str, RuntimeOptions] = {}
    for backend_id, values in given.items():
        if backend_id not in used:
            raise BackendOptionsError(
                f"backend_options names {backend_id!r}, which this program does not use; "
                f"its delegates use: {sorted(set(used)) or 'no backend'}")
        try:
            spec = get_backend(backend_id)
        except BackendNotFoundError as exc:
            raise BackendOptionsError(f"backend_options for {backend_id!r}: {exc}") from exc
        if spec.runtime_options is None:
            raise BackendOptionsError(f"backend {backend_id!r} declares no runtime options; drop its entry "
                                      "from backend_options")
        try:
            resolved[backend_id] = spec.runtime_options.from_mapping(values)
        except (TypeError, ValueError) as exc:
            raise BackendOptionsError(f"backend_options for {backend_id!r}: {exc}") from exc
    return resolved
