"""Move a lowered graph's constants out of the blob into the program's named data, as ExecuTorch 1.5.1 does.

ExecuTorch's runtime frees a delegate's blob right after ``init`` (memory-mapped programs are unmapped), so the
blob's own constant region stays empty: its constants go to named data, keyed by the SHA-256 of their bytes
(identical weights across partitions and methods are stored once). ExecuTorch 1.3.1 frees named data after
``init`` too (loading from a file), so only what XNNPACK packs at ``init`` -- the weights and biases of fully
connected and convolution nodes -- may live there; the static operands it reads by pointer on every call become
delegate arguments backed by program constants first (:mod:`~edgeport_xnnpack.preprocess.constant_inputs`).
"""

from __future__ import annotations

from typing import Any

from edgeport.named_data import NamedDataStore, NamedDataStoreOutput
from edgeport_xnnpack.schema.graph import UINT64_MAX, ConstantDataOffset, Graph

NAMED_DATA_ALIGNMENT = 16


DELEGATE_CONSTANT_TAG = "delegate_constant_tag"
"""``node.meta["custom"][DELEGATE_CONSTANT_TAG]`` on a weight's placeholder names the ``.ptd`` file (tag) its
named data goes to (ExecuTorch's key; ``edgeport.aot.tag_delegate_constants`` sets it)."""


def external_tag_of(edge_program: Any) -> str | None:
    """The one ``.ptd`` tag the partition's weights carry, or None when none is tagged.

    Constants are transformed on the way into the blob (packed, folded, permuted), so an entry cannot be traced
    back to one placeholder: a partition's weights go to one file or stay in the program. Mixed tags in one
    partition are refused with what to do.
    """
    sig = edge_program.graph_signature
    constant_inputs = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers) | set(
        getattr(sig, "inputs_to_lifted_tensor_constants", {}))
    tags = {}
    for node in edge_program.graph.nodes:
        if node.op == "placeholder" and node.name in constant_inputs:
            tags[node.name] = (node.meta.get("custom") or {}).get(DELEGATE_CONSTANT_TAG)
    distinct = set(tags.values())
    if distinct <= {None}:
        return None
    if len(distinct) > 1:
        raise ValueError(f"the partition's weights carry different .ptd tags ({sorted(map(str, distinct))}); tag every "
                         "weight of a partition the same (or none), e.g. with one gen_tag_fn result per model")
    (tag,) = distinct
    return tag


def move_constants_to_named_data(graph: Graph, data: bytes | bytearray | memoryview,
                                 external_tag: str | None = None) -> NamedDataStoreOutput:
    """Rewrite ``graph.constant_data`` to named keys (offset ``UINT64_MAX``) and return the store of their bytes.

    Entry 0 (no data) and empty entries stay as they are; after this the blob's constant region is empty.
    ``external_tag``: write the bytes to ``<external_tag>.ptd`` instead of the program.
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
        key = store.add_content(view[entry.offset:entry.offset + entry.size], NAMED_DATA_ALIGNMENT, external_tag)
        moved.append(ConstantDataOffset(UINT64_MAX, entry.size, key))
    graph.constant_data = moved
    return store.output()
