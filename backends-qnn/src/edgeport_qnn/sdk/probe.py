"""Child-process check of raw QNN context-binary bytes (stdin): load them and run each graph once on zeros.

Run by :func:`edgeport_qnn.sdk.binary.probe_in_child` as ``python -m edgeport_qnn.sdk.probe KIND BACKEND_LIB
SYSTEM_LIB``; the verdict is one JSON line on stdout. A crash of QNN ends this process, not the caller's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    from edgeport_qnn.sdk.errors import QnnError
    from edgeport_qnn.sdk.locate import QnnLibraries
    from edgeport_qnn.sdk.session import Context, QnnBackend

    kind, backend_lib, system_lib = argv
    system = Path(system_lib)
    libraries = QnnLibraries(directory=system.parent, source="probe", backends={kind: Path(backend_lib)})
    data = sys.stdin.buffer.read()
    try:
        with QnnBackend.load(kind, libraries=libraries) as backend:
            with Context.from_binary(backend, data, raw=True, probe=False) as context:
                for graph in context.graphs.values():
                    graph.execute([np.zeros(spec.shape, spec.dtype) for spec in graph.inputs])
    except (QnnError, ValueError, TypeError) as exc:
        sys.stdout.write(json.dumps({"ok": False, "error": str(exc).splitlines()[0],
                                     "code": getattr(exc, "code", None)}) + "\n")
        return 1
    sys.stdout.write(json.dumps({"ok": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
