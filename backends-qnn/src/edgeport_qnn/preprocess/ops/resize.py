"""Bilinear / nearest upsampling of 4-D tensors (``ResizeBilinear`` / ``ResizeNearestNeighbor``), NHWC."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import Lowering, Val, arg, static_shape


def _resize(op: str, align_arg: int | None):
    def lower(lw: Lowering, node: torch.fx.Node) -> Val:
        x = lw.nhwc(lw.value(node.args[0]))
        n, c, h, w = static_shape(node)
        if align_arg is None:  # PyTorch's legacy nearest: source index floor(i * in / out)
            params = {"align_corners": False, "half_pixel_centers": False}
        else:  # bilinear with align_corners=False samples at pixel centres: QNN's half_pixel_centers
            align = bool(arg(node, align_arg, "align_corners", False))
            params = {"align_corners": align, "half_pixel_centers": not align}
        return lw.node(op, [x.name], (n, h, w, c), params, nhwc=True)
    return lower


LOWERINGS = {"aten.upsample_bilinear2d.vec": _resize("ResizeBilinear", 2),
             "aten.upsample_nearest2d.vec": _resize("ResizeNearestNeighbor", None)}
