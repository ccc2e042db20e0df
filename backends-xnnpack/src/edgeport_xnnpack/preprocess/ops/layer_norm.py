"""native_layer_norm -> nodes both libXNNPACK 2022 and ExecuTorch's XNNPACK runtime define.

Over the normalized (trailing) dims, flattened to one dim of size D (a free reshape when more than one dim is
normalized)::

    mean = XNNFullyConnected(x, filter 1/D [1, D])              # [..., 1]
    diff = XNNSubtract(x, mean)                                 # broadcast
    var  = XNNFullyConnected(XNNSquare(diff), filter 1/D, bias eps)   # variance + eps in one node
    y    = XNNDiv(diff, XNNSquareRoot(var))                     # broadcast
    y    = XNNMultiply(y, weight); XNNAdd(y, bias)              # when affine

The two reductions share one constant filter (D floats). Two passes (mean first, then the mean of the squared
deviation) keep the result as accurate as eager's. Outputs 1 and 2 (mean, rstd = 1 / sqrt(var + eps)) are
produced only when a getitem reads them (rstd costs one more XNNDiv of [..., 1]).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder, Val
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.schema.graph import INVALID_ID


def _reshape(b: GraphBuilder, v: Val, shape: tuple[int, ...]) -> Val:
    if tuple(shape) == v.shape:
        return v
    out = b.new_val(shape)
    b.add("XNNStaticReshape", num_dims=len(shape), new_shape=list(shape), input_id=v.id, output_id=out.id, flags=0)
    return out


def _binary(b: GraphBuilder, kind: str, x: int, y: int, shape: tuple[int, ...]) -> Val:
    out = b.new_val(shape)
    b.add(kind, input1_id=x, input2_id=y, output_id=out.id, flags=0)
    return out


def _param(b: GraphBuilder, p: Any, d: int) -> int:
    """The weight / bias as a [D] value (a constant flattened, else the runtime value reshaped)."""
    if b.is_constant(p) and p not in b.env:
        return b.constant_array(b.tensor(p).detach().to(torch.float32).reshape(d).numpy())
    return _reshape(b, b.value(p, NCHW), (d,)).id


@lowers("aten.native_layer_norm.default")
def layer_norm(b: GraphBuilder, node: Any) -> None:
    x, normalized, weight, bias, eps = node.args[:5]
    xv = b.value(x, NCHW)
    k = len(normalized)
    lead = xv.shape[: len(xv.shape) - k]
    d = math.prod(xv.shape[len(xv.shape) - k:])
    flat = lead + (d,) if lead else (1, d)
    stat = flat[:-1] + (1,)
    x2 = _reshape(b, xv, flat)
    w = b.constant_array(np.full((1, d), 1.0 / d, dtype=np.float32))
    mean = b.new_val(stat)
    b.add("XNNFullyConnected", input1_id=x2.id, filter_id=w, bias_id=INVALID_ID, output_id=mean.id, flags=0)
    diff = _binary(b, "XNNSubtract", x2.id, mean.id, flat)
    sq = b.new_val(flat)
    b.add("XNNSquare", input_id=diff.id, output_id=sq.id, flags=0)
    var = b.new_val(stat)
    eps_id = b.constant_array(np.asarray([eps], dtype=np.float32))
    b.add("XNNFullyConnected", input1_id=sq.id, filter_id=w, bias_id=eps_id, output_id=var.id, flags=0)
    std = b.new_val(stat)
    b.add("XNNSquareRoot", input_id=var.id, output_id=std.id, flags=0)
    y = _binary(b, "XNNDiv", diff.id, std.id, flat)
    if weight is not None:
        y = _binary(b, "XNNMultiply", y.id, _param(b, weight, d), flat)
    if bias is not None:
        y = _binary(b, "XNNAdd", y.id, _param(b, bias, d), flat)
    b.set(node, _reshape(b, y, xv.shape))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    stat_shape = lead + (1,) * k
    if 1 in used:
        b.extra_outputs[(node, 1)] = _reshape(b, mean, stat_shape)
    if 2 in used:
        one = b.constant_array(np.ones((1,), dtype=np.float32))
        rstd = _binary(b, "XNNDiv", one, std.id, stat)
        b.extra_outputs[(node, 2)] = _reshape(b, rstd, stat_shape)
