"""``describe_blob`` of XnnpackBackend: what a delegate blob holds, for ``edgeport inspect`` (torch-free).

Reads edgeport's and ExecuTorch's blobs alike (the same reader the executor uses, every offset checked).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeport_xnnpack.schema.graph import INVALID_ID
from edgeport_xnnpack.schema.reader import BlobError, read_blob, split_blob

_DTYPES = {0: "invalid", 1: "fp32", 2: "fp16", 3: "qint8", 4: "quint8", 5: "qint32", 6: "qcint8", 7: "qcint32",
           8: "qcint4", 9: "qdint8", 10: "qbint4", 11: "qpint8", 12: "int32", 13: "pfp32", 14: "bf16"}


def describe_blob(processed: Any) -> dict[str, Any]:
    """Schema version, node counts by kind, values (inputs/outputs with dims), constant bytes in the blob and in
    the program's named data (keys), and the dims that are upper bounds of dynamic dimensions.

    Raises ``ValueError`` (``BlobError``) for bytes that are not a well-formed XNNPACK blob.
    """
    try:
        graph, _ = read_blob(processed)
        flatbuffer, constant_region = split_blob(processed)
    except BlobError:
        raise
    except (TypeError, ValueError) as exc:
        raise BlobError(str(exc)) from exc
    values = {v.id_out: v for v in graph.values}
    named = [c for c in graph.constant_data[1:] if c.named_key]
    inline = [c for c in graph.constant_data[1:] if not c.named_key]

    def value(i: int) -> dict[str, Any]:
        v = values.get(i)
        if v is None:
            return {"id": i}
        return {"id": i, "dtype": _DTYPES.get(v.datatype, str(v.datatype)), "dims": list(v.dims)}

    externals = sorted(v.external_id for v in graph.values if v.external_id != INVALID_ID)
    return {
        "format": "XNNPACK delegate flatbuffer (ExecuTorch's schema)",
        "schema_version": graph.version,
        "header": "XH00" if len(flatbuffer) != len(memoryview(processed).cast("B")) else "none",
        "target": "libXNNPACK (CPU)",
        "ops": dict(sorted(Counter(n.kind for n in graph.nodes).items())),
        "nodes": len(graph.nodes),
        "values": len(graph.values),
        "inputs": [value(i) for i in graph.input_ids],
        "outputs": [value(i) for i in graph.output_ids],
        "external_ids": externals,
        "dtypes": dict(sorted(Counter(_DTYPES.get(v.datatype, str(v.datatype)) for v in graph.values).items())),
        "constant_bytes_in_blob": len(constant_region),
        "named_data_keys": [c.named_key for c in named],
        "named_data_bytes": sum(c.size for c in named),
        "inline_constants": len(inline),
        "blob_bytes": len(memoryview(processed).cast("B")) if isinstance(processed, memoryview) else len(processed),
    }
