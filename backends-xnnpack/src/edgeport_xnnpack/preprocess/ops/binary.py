"""add / sub / mul / div (Tensor and Scalar) -> XNNAdd / XNNSubtract / XNNMultiply / XNNDiv with broadcasting.

The output is NHWC when a 4-D operand already is; lower-rank operands are brought to 4-D NHWC (constants are
permuted here, other values reshaped and transposed in the graph).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeport_xnnpack.preprocess.builder import NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.registry import lowers

_KIND = {"add": "XNNAdd", "sub": "XNNSubtract", "mul": "XNNMultiply", "div": "XNNDiv"}


def _operand(b: GraphBuilder, a: Any, layout: str) -> int:
    if not isinstance(a, torch.fx.Node):  # a Python scalar
        return b.constant_array(np.asarray([a], dtype=np.float32))
    if layout == NCHW:
        return b.value(a, NCHW).id
    if b.is_constant(a) and a not in b.env:
        t = b.tensor(a).detach().to(torch.float32)
        t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
        return b.constant_array(t.permute(0, 2, 3, 1).contiguous().numpy()) if t.numel() > 1 else \
            b.constant_array(t.reshape(-1).numpy())
    v = b.val(a)
    if len(v.shape) < 4:
        if int(np.prod(v.shape)) == 1:
            return v.id
        shape4 = (1,) * (4 - len(v.shape)) + v.shape
        r = b.new_val(shape4)
        b.add("XNNStaticReshape", num_dims=4, new_shape=list(shape4), input_id=v.id, output_id=r.id)
        v = r
    return b.convert(v, NHWC).id


def _lower(b: GraphBuilder, node: Any, kind: str, fold: bool = True) -> None:
    x, y = node.args[0], node.args[1]
    if (fold and kind in ("mul", "div") and b.views is not None and isinstance(y, (int, float)) and y != 0
            and b.views.scale(node, x, float(y) if kind == "mul" else 1.0 / float(y),
                              lambda: _lower(b, node, kind, fold=False))):
        return  # folded into the weights of the fully connected node the view reads
    out_shape = tuple(node.meta["val"].shape)
    layout = NCHW
    if len(out_shape) == 4 and any(isinstance(a, torch.fx.Node) and a in b.env and b.env[a].layout == NHWC
                                   for a in (x, y)):
        layout = NHWC
    ids = [_operand(b, a, layout) for a in (x, y)]
    out = Val(-1, layout, out_shape)
    out.id = b.new_value(out.dims)
    b.add(_KIND[kind], input1_id=ids[0], input2_id=ids[1], output_id=out.id, flags=0)
    b.set(node, out)


for _name in _KIND:
    def _make(kind: str) -> Any:
        def lower(b: GraphBuilder, node: Any) -> None:
            _lower(b, node, kind)
        return lower
    lowers(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_make(_name))
