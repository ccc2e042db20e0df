"""``describe_blob`` of ExampleBackend: what a blob holds, for ``edgeport inspect`` (torch-free)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeport.errors import ProgramError
from edgeport_example import format as fmt
from edgeport_example.runtime import load_program, parse_blob


def describe_blob(processed: Any) -> dict[str, Any]:
    """Format and producer versions, target, op counts, constant bytes and compile options of a blob.

    The blob is fully validated first (as the executor would); a bad one raises ``ValueError``.
    """
    try:
        doc, mv, start = parse_blob(processed)
        load_program(processed)  # every name, op, argument and constant range checked
    except ProgramError as exc:
        raise ValueError(str(exc)) from exc
    nodes = doc.get("nodes", [])
    constants = doc.get("constants", [])
    return {
        "format": f"{fmt.MAGIC.decode()} v{fmt.FORMAT_VERSION}",
        "producer_version": doc.get("plugin_version"),
        "target": doc.get("target"),
        "ops": dict(sorted(Counter(str(n.get("op")) for n in nodes).items())),
        "nodes": len(nodes),
        "inputs": [dict(spec) for spec in doc.get("input_specs", [])],
        "outputs": len(doc.get("outputs", [])),
        "constants": len(constants),
        "constant_bytes": sum(int(c.get("nbytes", 0)) for c in constants),
        "blob_bytes": len(mv),
        "compile_options": dict(doc.get("compile_specs", {})),
    }
