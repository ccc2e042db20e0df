"""max / average pooling (``PoolMax2d`` / ``PoolAvg2d``) and adaptive average pooling to 1x1 (``ReduceMean``),
NHWC."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import Lowering, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import pair, u32


def _pool(lw: Lowering, node: torch.fx.Node, op: str, extra: dict) -> Val:
    x = lw.nhwc(lw.value(node.args[0]))
    kernel = pair(node.args[1])
    stride = pair(arg(node, 2, "stride", None) or kernel)
    padding = pair(arg(node, 3, "padding", 0))
    out = static_shape(node)
    params = {"filter_size": u32(kernel), "stride": u32(stride),
              "pad_amount": u32([[padding[0]] * 2, [padding[1]] * 2]), **extra}
    return lw.node(op, [x.name], (out[0], out[2], out[3], out[1]), params, nhwc=True)


def max_pool2d(lw: Lowering, node: torch.fx.Node) -> Val:
    return _pool(lw, node, "PoolMax2d", {})


def max_pool2d_with_indices(lw: Lowering, node: torch.fx.Node) -> tuple:
    return (_pool(lw, node, "PoolMax2d", {}), None)


def avg_pool2d(lw: Lowering, node: torch.fx.Node) -> Val:
    return _pool(lw, node, "PoolAvg2d", {"count_pad_for_edges": bool(arg(node, 5, "count_include_pad", True))})


def adaptive_avg_pool2d(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.nhwc(lw.value(node.args[0]))
    n, c = x.shape[0], x.shape[1]
    return lw.node("ReduceMean", [x.name], (n, 1, 1, c), {"axes": u32([1, 2]), "keep_dims": True}, nhwc=True)


LOWERINGS = {"aten.max_pool2d.default": max_pool2d,
             "aten.max_pool2d_with_indices.default": max_pool2d_with_indices,
             "aten.avg_pool2d.default": avg_pool2d,
             "aten._adaptive_avg_pool2d.default": adaptive_avg_pool2d,
             "aten.adaptive_avg_pool2d.default": adaptive_avg_pool2d}
