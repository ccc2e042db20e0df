"""Move a lowered graph's constants out of the blob into the program's named data, as ExecuTorch 1.5.1 does.

ExecuTorch's runtime frees a delegate's blob right after ``init`` (memory-mapped programs are unmapped), while
XNNPACK keeps pointers to static data it does not pack -- the constant operand of a multiply, a layer norm's
epsilon. A blob that carries such constants in its own constant region therefore makes the stock runtime read
unmapped memory (SIGSEGV). Named data lives as long as the program, so every constant goes there, keyed by the
SHA-256 of its bytes (identical weights across partitions and methods are stored once).
"""

from __future__ import annotations

from edgeport.named_data import NamedDataStore, NamedDataStoreOutput
from edgeport_xnnpack.schema.graph import UINT64_MAX, ConstantDataOffset, Graph

NAMED_DATA_ALIGNMENT = 16


def move_constants_to_named_data(graph: Graph, data: bytes | bytearray | memoryview) -> NamedDataStoreOutput:
    """Rewrite ``graph.constant_data`` to named keys (offset ``UINT64_MAX``) and return the store of their bytes.

    Entry 0 (no data) and empty entries stay as they are; after this the blob's constant region is empty.
    """
    store = NamedDataStore()
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    moved: list[ConstantDataOffset] = []
    for i, entry in enumerate(graph.constant_data):
        if i == 0 or entry.named_key is not None or entry.size == 0:
            moved.append(entry)
            continue
        if entry.offset > len(view) or entry.size > len(view) - entry.offset:
            raise ValueError(f"constant_data[{i}] [{entry.offset}, +{entry.size}) lies outside the "
                             f"{len(view)}-byte constant data")
        key = store.add_content(view[entry.offset:entry.offset + entry.size], NAMED_DATA_ALIGNMENT)
        moved.append(ConstantDataOffset(UINT64_MAX, entry.size, key))
    graph.constant_data = moved
    return store.output()
