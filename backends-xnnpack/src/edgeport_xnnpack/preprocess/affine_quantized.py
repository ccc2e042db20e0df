"""torchao ``quantize_`` linears (the LLM schemes): ``torchao`` affine quant ops -> dynamically quantized fully
connected.

``quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4 | torch.int8, ...))`` exports,
for each ``nn.Linear``, as::

    scale, zp = torchao.choose_qparams_affine(x, mapping, [1, ..., 1, K], int8, -128, 127, ...)
    xq = torchao.dequantize_affine(torchao.quantize_affine(x, [1, ..., 1, K], scale, zp, int8, -128, 127), ...)
    y = linear(xq, torchao.dequantize_affine(w_int8, [1, group], w_scale, w_zp, int8, qmin, qmax), bias)

(the weight is torchao's unpacked int8 storage: int4 values sit in int8 bytes within [-8, 7]). XnnpackBackend
lowers it as ExecuTorch 1.5.1's XNNPACK delegate does: an ``XNNConvert`` to ``qdint8`` (per-row parameters
computed by XNNPACK at run time) and an ``XNNFullyConnected`` whose filter is

* ``qcint8`` with per-channel scales when the weight is int8 with one group per row (``PerAxis(0)``), or
* ``qbint4`` (``PerChannelGroupQuant``: bfloat16 scales in the constant data, two weights per byte with +8, the
  even input channel in the low nibble) when it is int4, per group (``PerGroup(g)``, ``g`` a multiple of 32
  dividing ``K``) or per row (one group of ``K``).

Refused with a reason (the linear then runs on the portable kernels): asymmetric weights (non-zero zero points:
XNNPACK's channelwise and blockwise filters have none), int8 weights per group (XNNPACK has no blockwise int8
filter; ExecuTorch 1.5.1 fails on them), other bit widths (int2, int3, ...), a group that is not a multiple of
32, or a weight-only quantized linear (no dynamic activation pattern).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name

__all__ = ["CHOOSE_A", "DQA", "QA", "BlockWeight", "affine_input_pattern", "affine_linear_reason",
           "affine_pattern_reason", "affine_weight", "bf16_round", "pack_int4"]

CHOOSE_A = "torchao.choose_qparams_affine.default"
QA = "torchao.quantize_affine.default"
DQA = "torchao.dequantize_affine.default"
_LINEAR = "aten.linear.default"

ValueOf = Callable[[object], "torch.Tensor | None"]


def _is(node: object, *names: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and op_name(node.target) in names


def _arg(node: torch.fx.Node, i: int, name: str, default: object = None) -> object:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@dataclass
class BlockWeight:
    """A linear's weight from ``torchao.dequantize_affine``: int8 storage ``[N, K]``, float32 scales
    ``[N, K / group]``, the group size and the bit width (4 or 8)."""

    data: torch.Tensor
    scales: np.ndarray
    group: int
    bits: int


def affine_input_pattern(dq: object) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """For the ``dequantize_affine`` of a per-token int8 dynamic activation: (the float input, the pattern's
    other nodes: quantize, choose_qparams, its getitems); ``None`` for anything else."""
    if not _is(dq, DQA):
        return None
    q = dq.args[0]
    if not _is(q, QA) or len(dq.args) < 4:
        return None
    scale, zp = dq.args[2], dq.args[3]
    if q.args[2] is not scale or q.args[3] is not zp:
        return None
    if not all(isinstance(g, torch.fx.Node) and g.target is operator.getitem for g in (scale, zp)):
        return None
    choose = scale.args[0]
    if not _is(choose, CHOOSE_A) or zp.args[0] is not choose or (scale.args[1], zp.args[1]) != (0, 1):
        return None
    x = choose.args[0]
    if q.args[0] is not x or not isinstance(x, torch.fx.Node):
        return None
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or val.dim() < 2:
        return None
    per_token = [1] * (val.dim() - 1) + [val.shape[-1]]
    if any(list(n.args[i]) != per_token for n, i in ((choose, 2), (q, 1), (dq, 1))):
        return None
    if str(choose.args[1]) not in ("ASYMMETRIC", "SYMMETRIC") or _arg(choose, 3, "target_dtype") != torch.int8:
        return None
    if (_arg(choose, 4, "quant_min"), _arg(choose, 5, "quant_max")) != (-128, 127):
        return None
    for n in (q, dq):
        if (_arg(n, 4, "dtype"), _arg(n, 5, "quant_min"), _arg(n, 6, "quant_max")) != (torch.int8, -128, 127):
            return None
    out = dq.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        return None
    return x, [choose, scale, zp, q]


def affine_weight(w: object, value_of: ValueOf) -> BlockWeight | str:
    """The linear weight ``w`` (a ``dequantize_affine`` of constants) as a :class:`BlockWeight`, or why XNNPACK
    cannot take it as a ``qcint8`` / ``qbint4`` filter."""
    if not _is(w, DQA):
        return f"weight {getattr(w, 'name', w)} is not a torchao dequantize_affine"
    data, scales, zps = (value_of(a) if isinstance(a, torch.fx.Node) else None for a in (w.args[0], w.args[2],
                                                                                        _arg(w, 3, "zero_point")))
    if data is None or scales is None:
        return f"{w.name}: weight data and scales must be constants"
    block = [int(b) for b in w.args[1]]
    qmin, qmax = _arg(w, 5, "quant_min"), _arg(w, 6, "quant_max")
    if data.dtype != torch.int8 or data.dim() != 2 or _arg(w, 4, "input_dtype") != torch.int8:
        return f"{w.name}: weight storage {data.dtype} {list(data.shape)} (int8, 2-D expected)"
    n, k = data.shape
    if (qmin, qmax) == (-8, 7):
        bits = 4
    elif (qmin, qmax) in ((-128, 127), (-127, 127)):
        bits = 8
    else:
        return (f"{w.name}: weight range [{qmin}, {qmax}]: XNNPACK takes int8 ([-128, 127]) or int4 ([-8, 7]) "
                "weights only")
    if len(block) != 2 or block[0] != 1 or block[1] <= 0 or k % block[1]:
        return f"{w.name}: block size {block} (expected [1, group] with the group dividing {k})"
    group = block[1]
    if zps is not None and bool(torch.any(zps != 0)):
        return (f"{w.name}: asymmetric weights (non-zero zero points); XNNPACK's int8 / int4 filters are "
                "symmetric (use weight_mapping_type=MappingType.SYMMETRIC)")
    if bits == 8 and group != k:
        return (f"{w.name}: int8 weights per group of {group}: XNNPACK has no blockwise int8 filter (use "
                "PerAxis(0), or int4 per group)")
    if bits == 4 and group % 32:
        return f"{w.name}: int4 group size {group} (XNNPACK's blockwise filters need a multiple of 32)"
    s = scales.detach().to(torch.float32).reshape(n, -1).numpy() if scales.numel() == n * (k // group) else None
    if s is None:
        return f"{w.name}: {scales.numel()} scales for a {[n, k]} weight in groups of {group}"
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        return f"{w.name}: weight scales must be positive and finite"
    lo, hi = int(data.min()), int(data.max())
    if lo < qmin or hi > qmax:
        return f"{w.name}: weight values [{lo}, {hi}] outside [{qmin}, {qmax}]"
    return BlockWeight(data.detach(), s, group, bits)


def affine_linear_reason(linear: torch.fx.Node, value_of: ValueOf) -> str | None:
    """Why ``linear`` (whose weight is a ``dequantize_affine``) is not a dynamically quantized fully connected
    XNNPACK runs, or ``None``."""
    if affine_input_pattern(linear.args[0]) is None:
        what = getattr(linear.args[0], "name", linear.args[0])
        return (f"{linear.name}: weight-quantized linear whose input ({what}) is not torchao's per-token int8 "
                "dynamic quantization (choose_qparams_affine -> quantize_affine -> dequantize_affine); only "
                "Int8DynamicActivationIntxWeightConfig linears are delegated")
    w = affine_weight(linear.args[1], value_of)
    return w if isinstance(w, str) else None


def _linear_users(node: torch.fx.Node, arg: int) -> list[torch.fx.Node] | str:
    users = list(node.users)
    for u in users:
        if not _is(u, _LINEAR) or len(u.args) <= arg or u.args[arg] is not node or (arg == 0 and u.args[1] is node):
            return f"{node.name} is read by {u.name} (only as a linear's {'input' if arg == 0 else 'weight'})"
    return users if users else f"{node.name} has no users"


def affine_pattern_reason(node: torch.fx.Node, value_of: ValueOf) -> str | None:
    """Why a torchao ``choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine`` node cannot go into
    an XNNPACK delegate, or ``None``: it must belong to a dynamically quantized linear (see the module
    docstring) -- the activation's pattern, or the weight's dequantize."""
    name = op_name(node.target)
    if name == DQA and all(value_of(a) is not None for a in node.all_input_nodes):
        users = _linear_users(node, 1)
    else:
        dqs: list[torch.fx.Node] = []
        if name == DQA:
            dqs = [node]
        elif name == QA:
            dqs = list(node.users)
        elif name == CHOOSE_A:
            for g in node.users:
                if g.target is not operator.getitem:
                    return f"choose_qparams_affine result read by {g.name} (not a getitem)"
                dqs.extend(u for u in g.users if _is(u, DQA))
        if not dqs:
            return f"{node.name}: dynamic quantization whose result nothing dequantizes"
        users = []
        for dq in dqs:
            if affine_input_pattern(dq) is None:
                return (f"{dq.name}: not torchao's per-token int8 dynamic quantization of a float32 tensor of rank "
                        ">= 2 (choose_qparams_affine -> quantize_affine -> dequantize_affine over [-128, 127])")
            if len(dq.args[0].users) != 1:
                return f"{dq.args[0].name}: the int8 value is read by more than its dequantize"
            found = _linear_users(dq, 0)
            if isinstance(found, str):
                return found
            users.extend(found)
    if isinstance(users, str):
        return users
    for u in users:
        why = affine_linear_reason(u, value_of)
        if why is not None:
            return why
    return None


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even (as torch's ``.to(torch.bfloat16)``)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def pack_int4(data: np.ndarray) -> np.ndarray:
    """int4 values ``[N, K]`` (int8 storage, in [-8, 7]) -> ``[N, ceil(K / 2)]`` bytes of ``value + 8``, the even
    input channel in the low nibble (ExecuTorch's ``qbint4`` / ``qcint4`` layout)."""
    u = data.astype(np.int16) + 8
    if u.shape[1] % 2:
        u = np.pad(u, ((0, 0), (0, 1)), constant_values=8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
