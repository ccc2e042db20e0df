"""ExecuTorch's XNNPACK delegate graph format: our schema text (``xnnpack.fbs``), model, writer and reader."""

from edgeport_xnnpack.schema.graph import (
    INVALID_ID,
    ConstantDataOffset,
    Graph,
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTensorQuant,
    TensorValue,
    XNode,
)
from edgeport_xnnpack.schema.reader import BlobError, read_blob, read_graph, split_blob
from edgeport_xnnpack.schema.writer import graph_to_flatbuffer, pack_blob, serialize

__all__ = [
    "INVALID_ID",
    "BlobError",
    "ConstantDataOffset",
    "Graph",
    "PerChannelGroupQuant",
    "PerChannelQuant",
    "PerTensorQuant",
    "TensorValue",
    "XNode",
    "graph_to_flatbuffer",
    "pack_blob",
    "read_blob",
    "read_graph",
    "serialize",
    "split_blob",
]
