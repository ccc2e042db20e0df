"""A thin layer over Arm's TOSA serializer (``tosa_serializer``): named tensors, constants, operators.

``tosa_serializer`` (from ``tosa-tools``) writes the TOSA 1.0 flatbuffer; edgeport keeps the naming, the constant
bookkeeping and the RESCALE arithmetic here so that op lowerings read as the TOSA operators they emit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tosa_serializer as ts

from edgeport.errors import LoweringError

DType = ts.DType
Op = ts.Op

_NP = {DType.INT8: np.int8, DType.INT16: np.int16, DType.INT32: np.int32, DType.INT48: np.int64, DType.FP32: np.float32,
       DType.BOOL: np.bool_}


def scale_to_multiplier_shift(scale: float, bits: int = 31) -> tuple[int, int]:
    """``scale ~= multiplier * 2**-shift`` with a ``bits``-bit multiplier (31: scale32, 15: the 16-bit multiplier
    int48 inputs need) and 2 <= shift <= 62 (TOSA RESCALE)."""
    if not math.isfinite(scale) or scale <= 0:
        raise LoweringError(f"quantization scale ratio {scale!r} is not a positive finite number")
    mantissa, exponent = math.frexp(scale)
    multiplier = round(mantissa * (1 << bits))
    if multiplier == 1 << bits:
        multiplier //= 2
        exponent += 1
    shift = bits - exponent
    if shift > 62:
        multiplier >>= min(bits, shift - 62)
        shift = 62
    if shift < 2:
        raise LoweringError(f"quantization scale ratio {scale:g} is too large for TOSA RESCALE (at most 2**29)")
    return multiplier, shift


class TosaGraph:
    """One TOSA basic block being built: ``input`` / ``const`` / ``tensor`` / ``op`` / ``output``."""

    def __init__(self, major: int = 1, minor: int = 0) -> None:
        self._ser = ts.TosaSerializer("", targetMajor=major, targetMinor=minor, targetPatch=0, targetDraft=False)
        self._count = 0
        self._tensors: dict[str, Any] = {}
        self._input_names: set[str] = set()
        self._outputs: set[str] = set()
        self.op_counts: dict[str, int] = {}

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def input(self, name: str, shape: Sequence[int], dtype: Any) -> str:
        tensor = ts.TosaSerializerTensor(name, list(shape), dtype, data=None)
        self._ser.addInputTensor(tensor)
        self._tensors[name] = tensor
        self._input_names.add(name)
        return name

    def const(self, values: Any, dtype: Any, hint: str = "const") -> str:
        """A constant tensor; ``values`` is converted to ``dtype``'s numpy type (shape kept)."""
        arr = np.ascontiguousarray(np.asarray(values, dtype=_NP[dtype]))
        name = self._name(hint)
        self._ser.addConst(list(arr.shape), dtype, arr.reshape(-1) if arr.ndim else arr.reshape(1), name=name)
        return name

    def shape_const(self, values: Sequence[int], hint: str = "shape") -> str:
        """A ``shape_t`` constant (the new shape of RESHAPE, the start/size of SLICE, the padding of PAD)."""
        arr = np.asarray([int(v) for v in values], dtype=np.int64)
        name = self._name(hint)
        self._ser.addConst([len(arr)], DType.SHAPE, arr, name=name)
        return name

    def tensor(self, shape: Sequence[int], dtype: Any) -> str:
        tensor = self._ser.addIntermediate(list(shape), dtype)
        self._tensors[tensor.name] = tensor
        return tensor.name

    def op(self, op: Any, inputs: Sequence[str], outputs: Sequence[str], attr: str, **fields: Any) -> None:
        """Emit ``op``; ``attr`` names the serializer's attribute method (``"Conv2dAttribute"``)."""
        a = ts.TosaSerializerAttribute()
        getattr(a, attr)(**fields)
        self._ser.addOperator(op, list(inputs), list(outputs), a)
        key = str(op).rsplit(".", 1)[-1]
        self.op_counts[key] = self.op_counts.get(key, 0) + 1

    def output(self, name: str, shape: Sequence[int], dtype: Any) -> None:
        """Mark ``name`` as a graph output (through an IDENTITY when it is a graph input or already an output)."""
        tensor = self._tensors.get(name)
        if tensor is None or name in self._outputs or name in self._input_names:
            copy = self.tensor(shape, dtype)
            self.op(Op.IDENTITY, [name], [copy], "IdentityAttribute")
            name, tensor = copy, self._tensors[copy]
        self._outputs.add(name)
        self._ser.addOutputTensor(tensor)


    def serialize(self) -> bytes:
        return bytes(self._ser.serialize())

    # -- composite helpers ------------------------------------------------------------------------------------
    def rescale(self, x: str, out_shape: Sequence[int], in_dtype: Any, out_dtype: Any, scales: Sequence[float],
                in_zp: int = 0, out_zp: int = 0) -> str:
        """RESCALE ``x`` by ``scales`` (one, or one per channel of the last axis), single rounding."""
        scale32 = in_dtype != DType.INT48  # TOSA: an int48 input takes a 16-bit multiplier
        pairs = [scale_to_multiplier_shift(float(s), 31 if scale32 else 15) for s in scales]
        mult = self.const([p[0] for p in pairs], DType.INT32 if scale32 else DType.INT16, "multiplier")
        shift = self.const([p[1] for p in pairs], DType.INT8, "shift")
        izp = self.const([in_zp], in_dtype, "input_zp")
        ozp = self.const([out_zp], out_dtype, "output_zp")
        out = self.tensor(out_shape, out_dtype)
        self.op(Op.RESCALE, [x, mult, shift, izp, ozp], [out], "RescaleAttribute", scale32=scale32,
                rounding_mode=ts.RoundingMode.SINGLE_ROUND, per_channel=len(pairs) > 1, input_unsigned=False,
                output_unsigned=False)
        return out

    def reshape(self, x: str, shape: Sequence[int], dtype: Any) -> str:
        out = self.tensor(shape, dtype)
        self.op(Op.RESHAPE, [x, self.shape_const(shape)], [out], "ReshapeAttribute")
        return out

    def transpose(self, x: str, shape: Sequence[int], perm: Sequence[int], dtype: Any) -> str:
        out = self.tensor([shape[p] for p in perm], dtype)
        self.op(Op.TRANSPOSE, [x], [out], "TransposeAttribute", perms=list(perm))
        return out

    def clamp(self, x: str, shape: Sequence[int], dtype: Any, lo: float, hi: float) -> str:
        out = self.tensor(shape, dtype)
        if dtype == DType.FP32:
            bounds = (np.float32(lo).tobytes(), np.float32(hi).tobytes())
        else:
            bounds = (np.array([lo], _NP[dtype]).tobytes(), np.array([hi], _NP[dtype]).tobytes())
        self.op(Op.CLAMP, [x], [out], "ClampAttribute", min_val=list(bounds[0]), max_val=list(bounds[1]),
                nan_mode=ts.NanPropagationMode.PROPAGATE)
        return out
