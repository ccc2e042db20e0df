"""Find Qualcomm's QNN libraries on this machine (never bundled with edgeport).

Looked for, in order:

1. ``$QNN_SDK_ROOT/lib/x86_64-linux-clang/`` (an unpacked QAIRT/QNN SDK);
2. the installed ``onnxruntime-qnn`` wheel (``pip install 'edgeport-qnn[htp]'``), whose package directory ships
   QAIRT's host libraries. Found with ``importlib.util.find_spec``; onnxruntime is never imported.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

SDK_ENV = "QNN_SDK_ROOT"
SDK_LIB_SUBDIR = Path("lib") / "x86_64-linux-clang"

#: Backend kind -> library file name.
BACKEND_LIBRARIES = {"htp": "libQnnHtp.so", "gpu": "libQnnGpu.so", "cpu": "libQnnCpu.so",
                     "saver": "libQnnSaver.so", "ir": "libQnnIr.so"}
SYSTEM_LIBRARY = "libQnnSystem.so"

INSTALL_HINT = ("install Qualcomm's QNN host libraries: `pip install 'edgeport-qnn[htp]'` (pulls the "
                "onnxruntime-qnn wheel, which ships them), or unpack the QAIRT SDK and set "
                f"{SDK_ENV} (libraries under $QNN_SDK_ROOT/{SDK_LIB_SUBDIR}/)")


class QnnLibrariesNotFound(FileNotFoundError):
    """No usable QNN library directory; the message says how to install one."""


@dataclass(frozen=True)
class QnnLibraries:
    """Where the QNN libraries are, and where they came from."""

    directory: Path
    source: str  #: ``"QNN_SDK_ROOT"`` or ``"onnxruntime-qnn"``
    qnn_version: str | None = None  #: QAIRT version when known (``"2.51.0"``)
    backends: dict[str, Path] = field(default_factory=dict)  #: kind -> library path, only those present

    @property
    def system(self) -> Path:
        return self.directory / SYSTEM_LIBRARY

    def backend(self, kind: str) -> Path:
        """The library of backend ``kind`` (``"htp"``, ``"gpu"``, ...)."""
        if kind not in BACKEND_LIBRARIES:
            raise ValueError(f"unknown QNN backend kind {kind!r}; known: {sorted(BACKEND_LIBRARIES)}")
        path = self.backends.get(kind)
        if path is None:
            raise QnnLibrariesNotFound(
                f"QNN backend {kind!r} ({BACKEND_LIBRARIES[kind]}) is not in {self.directory} (from {self.source}); "
                f"present: {sorted(self.backends) or 'none'}")
        return path


def _scan(directory: Path, source: str, qnn_version: str | None) -> QnnLibraries | None:
    if not (directory / SYSTEM_LIBRARY).is_file():
        return None
    backends = {kind: directory / name for kind, name in BACKEND_LIBRARIES.items() if (directory / name).is_file()}
    if not backends:
        return None
    return QnnLibraries(directory=directory, source=source, qnn_version=qnn_version, backends=backends)


def _sdk_version(root: Path) -> str | None:
    for name in ("sdk.yaml", "QNN_README.txt"):
        path = root / name
        if path.is_file():
            match = re.search(r"(\d+\.\d+\.\d+)", path.read_text(errors="replace")[:4096])
            if match:
                return match.group(1)
    return None


def _wheel_directory() -> tuple[Path, str | None] | None:
    try:
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    version = None
    info = directory / "build_and_package_info.py"
    if info.is_file():  # read, not imported
        match = re.search(r"qnn_version\s*=\s*['\"]([^'\"]+)['\"]", info.read_text(errors="replace"))
        version = match.group(1) if match else None
    return directory, version


def find_qnn_libraries(env: dict[str, str] | None = None) -> QnnLibraries:
    """Locate the QNN libraries; raise :class:`QnnLibrariesNotFound` (saying how to install them) if absent."""
    env = os.environ if env is None else env
    tried: list[str] = []
    root = env.get(SDK_ENV)
    if root:
        directory = Path(root).expanduser() / SDK_LIB_SUBDIR
        found = _scan(directory, SDK_ENV, _sdk_version(Path(root).expanduser()))
        if found is not None:
            return found
        tried.append(f"{SDK_ENV}={root} (no {SYSTEM_LIBRARY} plus a backend library in {directory})")
    wheel = _wheel_directory()
    if wheel is not None:
        found = _scan(wheel[0], "onnxruntime-qnn", wheel[1])
        if found is not None:
            return found
        tried.append(f"onnxruntime-qnn at {wheel[0]} (libraries missing)")
    else:
        tried.append("onnxruntime-qnn (not installed)")
    raise QnnLibrariesNotFound(f"QNN libraries not found; tried {'; '.join(tried)}. To fix, {INSTALL_HINT}.")


def qnn_available() -> bool:
    """Whether :func:`find_qnn_libraries` would succeed (for test skips)."""
    try:
        find_qnn_libraries()
    except QnnLibrariesNotFound:
        return False
    return True
