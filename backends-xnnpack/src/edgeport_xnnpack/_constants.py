"""Reading a blob's constants: the constant data region, legacy buffers or the program's named data (torch-free).

Every offset, size and key comes from the blob, so each is checked before it is used; a problem raises
:class:`~edgeport.errors.ProgramError`. The arrays returned are read-only views of the caller's memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edgeport.errors import ProgramError
from edgeport_xnnpack.capabilities import BACKEND_ID
from edgeport_xnnpack.schema.graph import (
    FP32,
    UINT64_MAX,
    Graph,
    PerChannelGroupQuant,
    PerChannelQuant,
    TensorValue,
)

NamedData = Callable[[str], Any] | Mapping[str, Any]
NP_DTYPES = {1: np.float32, 2: np.float16, 3: np.int8, 4: np.uint8, 5: np.int32, 6: np.int8, 7: np.int32,
             10: np.uint8}
_QBINT4 = 10  # two 4-bit values per byte along the last dim (padded to even): data is [..., ceil(K / 2)] bytes


def _fail(msg: str) -> ProgramError:
    return ProgramError(f"{BACKEND_ID} blob: {msg}")


def load_constant(graph: Graph, constants: memoryview, named: NamedData | None, v: TensorValue,
                  where: str) -> np.ndarray:
    """The data of constant value ``v`` (``v.constant_buffer_idx`` != 0), shaped ``v.dims``."""
    idx, dtype = v.constant_buffer_idx, np.dtype(NP_DTYPES[v.datatype])
    shape = list(v.dims)
    if v.datatype == _QBINT4:
        if not shape:
            raise _fail(f"{where}: a qbint4 value needs dims")
        shape[-1] = (shape[-1] + 1) // 2
    nbytes = math.prod(shape) * dtype.itemsize
    if graph.legacy_buffers is not None and not len(constants):
        if idx >= len(graph.legacy_buffers):
            raise _fail(f"{where}: constant_buffer index {idx} out of range")
        data = graph.legacy_buffers[idx]
    else:
        if idx >= len(graph.constant_data):
            raise _fail(f"{where}: constant_data index {idx} out of range ({len(graph.constant_data)})")
        entry = graph.constant_data[idx]
        if entry.named_key is not None and (entry.named_key or entry.offset == UINT64_MAX):
            data = _named(named, entry.named_key, where)
        else:
            if entry.offset > len(constants) or entry.size > len(constants) - entry.offset:
                raise _fail(f"{where}: constant [{entry.offset}, +{entry.size}) lies outside the "
                            f"{len(constants)}-byte constant data (truncated blob?)")
            data = constants[entry.offset:entry.offset + entry.size]
    if len(data) < nbytes:
        raise _fail(f"{where}: constant has {len(data)} bytes, dims {v.dims} need {nbytes}")
    return np.frombuffer(data, dtype=dtype, count=math.prod(shape)).reshape(shape)


def scales_from_buffer(graph: Graph, constants: memoryview, named: NamedData | None, v: TensorValue,
                       where: str) -> TensorValue:
    """A per-channel value whose scales ExecuTorch stored in the constant data (``scale_buffer_idx``)."""
    q = v.quant
    assert isinstance(q, PerChannelQuant)
    holder = TensorValue(FP32, [q.num_scales], -1, constant_buffer_idx=q.scale_buffer_idx)
    scales = load_constant(graph, constants, named, holder, f"{where} scales")
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise _fail(f"{where}: per-channel scales must be positive and finite")
    return replace(v, quant=replace(q, scale=[float(s) for s in scales]))


def group_scales(graph: Graph, constants: memoryview, named: NamedData | None, v: TensorValue,
                 where: str) -> np.ndarray:
    """The float32 block scales of a ``qbint4`` value: bfloat16 in constant data ``scale_buffer_idx`` (ExecuTorch
    1.5.1), else the flatbuffer's float32 list rounded to bfloat16 as XNNPACK's blockwise filters take them."""
    q = v.quant
    assert isinstance(q, PerChannelGroupQuant)
    if len(v.dims) != 2 or q.group_size <= 0 or v.dims[1] % q.group_size:
        raise _fail(f"{where}: qbint4 dims {v.dims} with group size {q.group_size}")
    count = v.dims[0] * (v.dims[1] // q.group_size)
    if q.scale_buffer_idx:
        if q.num_scales != count:
            raise _fail(f"{where}: {q.num_scales} block scales, dims {v.dims} in groups of {q.group_size} need {count}")
        holder = TensorValue(2, [count], -1, constant_buffer_idx=q.scale_buffer_idx)  # 2 bytes each
        bits = load_constant(graph, constants, named, holder, f"{where} scales").view(np.uint16)
    elif len(q.scale) == count:
        f = np.asarray(q.scale, np.float32).view(np.uint32)
        bits = ((f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    else:
        raise _fail(f"{where}: qbint4 value without {count} block scales")
    scales = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise _fail(f"{where}: block scales must be positive and finite")
    return scales


def _named(named: NamedData | None, key: str, where: str) -> memoryview:
    if named is None:
        raise _fail(f"{where}: weights are stored in the program's named data (key {key[:16]}...), but no "
                    "named data was passed to the executor; this edgeport runtime must pass named_data= to init")
    try:
        data = named[key] if isinstance(named, Mapping) else named(key)
        mv = memoryview(data)
        return mv.cast("B") if mv.ndim != 1 or mv.itemsize != 1 else mv
    except Exception as exc:  # noqa: BLE001 - any lookup failure is a program error
        raise _fail(f"{where}: named data {key!r} not found: {exc}") from exc
