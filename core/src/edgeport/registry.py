"""Plugin discovery and the typed registries plugins add to.

Plugins are found through the entry-point group ``edgeport.backends`` (via ``importlib-metadata``) and through
:func:`register_plugin` for a plugin defined in a user's script. Each plugin's hooks are called in isolation: a
plugin that fails to import or whose hook raises is recorded in :func:`plugin_errors` (and warned about), and the
others load normally.

Environment switches:

* ``EDGEPORT_DISABLE_PLUGIN_AUTOLOAD=1`` — do not load entry-point plugins (built-ins and plugins registered
  with :func:`register_plugin` still load).
* ``EDGEPORT_PLUGINS=a,b`` — load only the entry points with these names.
"""

from __future__ import annotations

import argparse
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import importlib_metadata
import pluggy

from edgeport import hookspecs
from edgeport.backend import BackendSpec
from edgeport.errors import BackendNotFoundError, PluginLoadError

ENTRY_POINT_GROUP = "edgeport.backends"

# Distribution to install for the backends edgeport's project publishes, by backend id.
KNOWN_BACKEND_PACKAGES: dict[str, str] = {
    "XnnpackBackend": "edgeport-xnnpack",
    "CoreMLBackend": "edgeport-coreml",
    "VulkanBackend": "edgeport-vulkan",
    "QnnBackend": "edgeport-qnn",
    "EthosUBackend": "edgeport-arm",
    "TOSABackend": "edgeport-arm",
    "ExampleBackend": "edgeport-example",
}


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose hook raised."""

    plugin: str
    distribution: str | None
    stage: str  # "import" or the hook name
    error: str

    def __str__(self) -> str:
        dist = f" (distribution {self.distribution})" if self.distribution else ""
        return f"plugin {self.plugin!r}{dist} failed in {self.stage}: {self.error}"


class BackendRegistry:
    """Collects :class:`BackendSpec` objects from ``edgeport_register_backends`` hooks."""

    def __init__(self) -> None:
        self._specs: dict[str, BackendSpec] = {}
        self._current_plugin: tuple[str, str | None] = ("<unknown>", None)

    def add(self, spec: BackendSpec) -> None:
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"registry.add expects a BackendSpec, got {type(spec).__name__}")
        plugin, dist = self._current_plugin
        if spec.distribution is None:
            spec.distribution = dist
        if spec.backend_id in self._specs:
            other = self._specs[spec.backend_id]
            raise PluginLoadError(
                f"backend id {spec.backend_id!r} is registered twice: by {other.distribution or 'a script'} "
                f"and by {dist or plugin}; uninstall one of them"
            )
        self._specs[spec.backend_id] = spec

    def get(self, backend_id: str) -> BackendSpec | None:
        return self._specs.get(backend_id)

    def __iter__(self) -> Iterator[BackendSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.backend_id))

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._specs

    def __len__(self) -> int:
        return len(self._specs)


@dataclass(frozen=True)
class CommandSpec:
    """A subcommand a plugin adds to the ``edgeport`` command line."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    distribution: str | None = None


BUILTIN_COMMANDS = frozenset({"backends", "doctor", "new-backend", "inspect", "op-table", "validate", "view", "lower",
                              "run"})


class CommandRegistry:
    """Collects :class:`CommandSpec` objects from ``edgeport_register_commands`` hooks."""

    def __init__(self) -> None:
        self._specs: dict[str, CommandSpec] = {}
        self._current_plugin: tuple[str, str | None] = ("<unknown>", None)

    def add(self, spec: CommandSpec) -> None:
        if not isinstance(spec, CommandSpec):
            raise TypeError(f"registry.add expects a CommandSpec, got {type(spec).__name__}")
        plugin, dist = self._current_plugin
        if not spec.name or not spec.name.replace("-", "").isalnum() or spec.name != spec.name.lower():
            raise PluginLoadError(f"command name {spec.name!r} must be lowercase letters, digits and '-'")
        if spec.name in BUILTIN_COMMANDS:
            raise PluginLoadError(f"command {spec.name!r} is built into edgeport; {dist or plugin} must pick another")
        if spec.name in self._specs:
            other = self._specs[spec.name]
            raise PluginLoadError(
                f"command {spec.name!r} is registered twice: by {other.distribution or 'a script'} and by "
                f"{dist or plugin}; uninstall one of them"
            )
        self._specs[spec.name] = CommandSpec(spec.name, spec.help, spec.configure, spec.run, spec.distribution or dist)

    def get(self, name: str) -> CommandSpec | None:
        return self._specs.get(name)

    def __iter__(self) -> Iterator[CommandSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._specs)


@dataclass(frozen=True)
class KernelEntry:
    op: str
    fn: Callable[..., Any]
    library: str


class KernelRegistry:
    """Collects runtime kernels for non-delegated ops from ``edgeport_register_kernels`` hooks.

    Registration order is the override order: a later ``add`` of the same op wins, and :attr:`overridden`
    keeps what it replaced so the choice is visible.
    """

    def __init__(self) -> None:
        self._kernels: dict[str, KernelEntry] = {}
        self.overridden: list[KernelEntry] = []

    def add(self, op: str, fn: Callable[..., Any], library: str) -> None:
        if "::" not in op:
            raise ValueError(f"kernel op name {op!r} must look like 'aten::add.out'")
        if op in self._kernels:
            self.overridden.append(self._kernels[op])
        self._kernels[op] = KernelEntry(op, fn, library)

    def get(self, op: str) -> KernelEntry | None:
        return self._kernels.get(op)

    def ops(self) -> list[str]:
        return sorted(self._kernels)


class _PluginHost:
    """Owns the pluggy manager, loads plugins once, and rebuilds registries when a plugin is added."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self._distributions: dict[str, str | None] = {}
        self._loaded = False
        self.failures: list[PluginFailure] = []
        self._import_failures: list[PluginFailure] = []
        self._backends: BackendRegistry | None = None
        self._kernels: KernelRegistry | None = None
        self._commands: CommandRegistry | None = None

    # -- loading -----------------------------------------------------------------------------------------
    def _load_builtins(self) -> None:
        from edgeport import builtin_plugins

        for name, module in builtin_plugins.plugins():
            self.pm.register(module, name=name)
            self._distributions[name] = "edgeport"

    def _load_entry_points(self) -> None:
        if os.environ.get("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0"):
            return
        only = {p.strip() for p in os.environ.get("EDGEPORT_PLUGINS", "").split(",") if p.strip()}
        seen: set[str] = set()
        for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
            if only and ep.name not in only:
                continue
            dist = ep.dist.name if ep.dist is not None else None
            key = f"{ep.name}:{ep.value}"
            if key in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(key)
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must never hide the others
                failure = PluginFailure(ep.name, dist, "import", f"{type(exc).__name__}: {exc}")
                self._import_failures.append(failure)
                warnings.warn(str(failure), RuntimeWarning, stacklevel=3)
                continue
            if self.pm.is_registered(plugin):
                continue
            self.pm.register(plugin, name=ep.name)
            self._distributions[ep.name] = dist

    def ensure_loaded(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._load_builtins()
            self._load_entry_points()
            self._loaded = True
            self._collect()

    def register(self, plugin: object, name: str | None = None) -> str:
        with self._lock:
            self.ensure_loaded()
            if self.pm.is_registered(plugin):
                return self.pm.get_name(plugin) or ""
            registered = self.pm.register(plugin, name=name)
            if registered is None:
                raise PluginLoadError(f"plugin {name or plugin!r} is blocked or already registered")
            self._distributions.setdefault(registered, None)
            self._collect()
            return registered

    def unregister(self, plugin: object) -> None:
        with self._lock:
            if not self.pm.is_registered(plugin):
                return
            self.pm.unregister(plugin)
            self._collect()

    # -- collecting --------------------------------------------------------------------------------------
    def _call_each(self, hook_name: str, registry: Any) -> None:
        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            dist = self._distributions.get(impl.plugin_name)
            registry._current_plugin = (impl.plugin_name, dist)
            try:
                impl.function(registry=registry)
            except Exception as exc:  # noqa: BLE001 - isolate plugins from each other
                failure = PluginFailure(impl.plugin_name, dist, hook_name, f"{type(exc).__name__}: {exc}")
                self.failures.append(failure)
                warnings.warn(str(failure), RuntimeWarning, stacklevel=4)
        registry._current_plugin = ("<unknown>", None)

    def _collect(self) -> None:
        self.failures = list(self._import_failures)
        backends = BackendRegistry()
        self._call_each("edgeport_register_backends", backends)
        kernels = KernelRegistry()
        self._call_each("edgeport_register_kernels", kernels)
        commands = CommandRegistry()
        self._call_each("edgeport_register_commands", commands)
        self._backends, self._kernels, self._commands = backends, kernels, commands

    @property
    def backends(self) -> BackendRegistry:
        self.ensure_loaded()
        assert self._backends is not None
        return self._backends

    @property
    def kernels(self) -> KernelRegistry:
        self.ensure_loaded()
        assert self._kernels is not None
        return self._kernels

    @property
    def commands(self) -> CommandRegistry:
        self.ensure_loaded()
        assert self._commands is not None
        return self._commands


_host = _PluginHost()


def reload_plugins() -> None:
    """Forget every loaded plugin and discover them again (after installing one, or changing the environment
    switches). Plugins registered with :func:`register_plugin` must be registered again."""
    global _host
    _host = _PluginHost()


def register_plugin(plugin: object | ModuleType, name: str | None = None) -> str:
    """Register a plugin object (a module or an object with ``@hookimpl`` methods) defined outside a package.

    Returns the name it was registered under. Its backends become visible to :func:`get_backend` at once.
    """
    return _host.register(plugin, name=name)


def unregister_plugin(plugin: object) -> None:
    """Remove a plugin registered with :func:`register_plugin`."""
    _host.unregister(plugin)


def list_backends() -> list[BackendSpec]:
    """Every registered backend, sorted by id."""
    return list(_host.backends)


def get_backend(backend_id: str) -> BackendSpec:
    """The :class:`BackendSpec` registered under ``backend_id``.

    Raises :class:`BackendNotFoundError` naming the installed backends and the package that provides the one asked
    for.
    """
    spec = _host.backends.get(backend_id)
    if spec is not None:
        return spec
    raise BackendNotFoundError(backend_not_found_message(backend_id))


def backend_not_found_message(backend_id: str) -> str:
    installed = ", ".join(s.backend_id for s in _host.backends) or "(none)"
    package = KNOWN_BACKEND_PACKAGES.get(backend_id)
    hint = f"pip install {package}" if package else "install the edgeport plugin package that provides it"
    msg = f"backend {backend_id!r} is not installed. Installed backends: {installed}. To get it: {hint}"
    broken = [str(f) for f in _host.failures]
    if broken:
        msg += ". Plugins that failed to load: " + "; ".join(broken)
    return msg


def plugin_errors() -> list[PluginFailure]:
    """Plugins that failed to import or whose hooks raised, in load order."""
    _host.ensure_loaded()
    return list(_host.failures)


def kernel_registry() -> KernelRegistry:
    """The runtime kernel registry assembled from every ``edgeport_register_kernels`` hook."""
    return _host.kernels


def plugin_commands() -> list[CommandSpec]:
    """The ``edgeport`` subcommands plugins registered through ``edgeport_register_commands``, sorted by name."""
    return list(_host.commands)


def plugin_manager() -> pluggy.PluginManager:
    """The underlying pluggy manager (for tools such as ``edgeport backends``)."""
    _host.ensure_loaded()
    return _host.pm


def plugin_distribution(plugin_name: str) -> str | None:
    return _host._distributions.get(plugin_name)
