"""The ExampleBackend blob format (version 1). Torch-free: shared by ``preprocess`` and the executor.

Layout, all integers little-endian::

    offset 0   4 bytes   magic b"EPEX"
    offset 4   uint32    format version (FORMAT_VERSION)
    offset 8   uint32    length N of the JSON document in bytes
    offset 12  N bytes   UTF-8 JSON document
               padding   zero bytes up to the next multiple of 16 (from the start of the blob): the data region
    data       ...       raw little-endian constant bytes; each constant starts at a multiple of 16

The JSON document::

    {
      "backend_id": "ExampleBackend",
      "plugin_version": "0.1.0",            # edgeport-example version that wrote the blob
      "target": "numpy",
      "compile_specs": {"max_value": 4},    # the compile specs preprocess was given, decoded
      "inputs": ["x", "y"],                 # value names of the delegate's inputs, in call order
      "input_specs": [{"dtype": "float32", "shape": [2, 3]}, ...],   # null for a symbolic dimension
      "constants": [{"name": "p_w", "dtype": "float32", "shape": [4, 4], "offset": 0, "nbytes": 64}],
      "nodes": [{"op": "aten.add.Tensor", "args": [{"value": "x"}, {"value": "p_w"}, 1], "output": "add"}],
      "outputs": ["add"]
    }

``offset`` is relative to the start of the data region. ``args`` is the op's full positional argument list in
schema order (keyword-only arguments and defaults included); ``{"value": name}`` refers to an input, a constant
or an earlier node's output, anything else is a JSON literal.
"""

from __future__ import annotations

import struct

MAGIC = b"EPEX"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sII")
ALIGNMENT = 16
TARGET = "numpy"

# dtype name (torch spelling) -> numpy little-endian type string
DTYPES: dict[str, str] = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "|i1",
    "uint8": "|u1",
    "bool": "|b1",
}


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def data_start(json_length: int) -> int:
    """Offset of the data region in a blob whose JSON document is ``json_length`` bytes long."""
    return align(HEADER.size + json_length)


def pack(document_json: bytes, data: bytes) -> bytes:
    """Assemble a blob from the encoded JSON document and the data region."""
    head = HEADER.pack(MAGIC, FORMAT_VERSION, len(document_json)) + document_json
    return head + bytes(data_start(len(document_json)) - len(head)) + data
