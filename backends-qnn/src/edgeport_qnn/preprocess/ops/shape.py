"""view / squeeze / unsqueeze / clone (``Reshape``), expand (``Tile``), permute (``Transpose``), select, slice
and split (``StridedSlice``), cat (``Concat``; NHWC when every input is)."""

from __future__ import annotations

import numpy as np
import torch

from edgeport_qnn.preprocess.lowering import NCHW_TO_NHWC, Lowering, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import u32


def reshape(lw: Lowering, node: torch.fx.Node) -> Val:
    v = lw.nchw(lw.value(node.args[0]))
    out = static_shape(node)
    return lw.node("Reshape", [v.name], out if out else (1,), logical=out)


def permute(lw: Lowering, node: torch.fx.Node) -> Val:
    v = lw.nchw(lw.value(node.args[0]))
    perm = [int(p) % len(v.shape) for p in node.args[1]]
    return lw.node("Transpose", [v.name], static_shape(node), {"perm": u32(perm)})


def _strided_slice(lw: Lowering, v: Val, dim: int, start: int, end: int, step: int) -> Val:
    ranges = np.array([[0, n, 1] for n in v.shape], np.int32)
    ranges[dim] = [start, end, step]
    shape = list(v.shape)
    shape[dim] = len(range(start, end, step))
    return lw.node("StridedSlice", [v.name], tuple(shape), {"ranges": ranges})


def select(lw: Lowering, node: torch.fx.Node) -> Val:
    v = lw.nchw(lw.value(node.args[0]))
    dim = int(node.args[1]) % len(v.shape)
    index = int(node.args[2]) % v.shape[dim]
    part = _strided_slice(lw, v, dim, index, index + 1, 1)
    out = static_shape(node)
    return lw.node("Reshape", [part.name], out if out else (1,), logical=out)


def slice_(lw: Lowering, node: torch.fx.Node) -> Val:
    v = lw.nchw(lw.value(node.args[0]))
    dim = int(arg(node, 1, "dim", 0)) % len(v.shape)
    start, end, step = slice(arg(node, 2, "start", None), arg(node, 3, "end", None),
                             int(arg(node, 4, "step", 1))).indices(v.shape[dim])
    return _strided_slice(lw, v, dim, start, end, step)


def split(lw: Lowering, node: torch.fx.Node) -> tuple:
    """split_with_sizes_copy: one ``StridedSlice`` per piece (GPT-2's query / key / value split)."""
    v = lw.nchw(lw.value(node.args[0]))
    dim = int(arg(node, 2, "dim", 0)) % len(v.shape)
    pieces, start = [], 0
    for size in node.args[1]:
        pieces.append(_strided_slice(lw, v, dim, start, start + int(size), 1))
        start += int(size)
    return tuple(pieces)


def expand(lw: Lowering, node: torch.fx.Node) -> Val:
    """expand_copy: ``Reshape`` to the output's rank (leading 1s), then ``Tile`` along the broadcast dimensions
    (grouped-query attention's repeated key / value heads)."""
    v = lw.nchw(lw.value(node.args[0]))
    out = static_shape(node)
    src = (1,) * (len(out) - len(v.shape)) + tuple(v.shape)
    if src != tuple(v.shape):
        v = lw.node("Reshape", [v.name], src)
    if src == tuple(out):
        return lw.node("Reshape", [v.name], out)
    multiples = u32([o // s for o, s in zip(out, src)])
    return lw.node("Tile", [v.name], out, {"multiples": multiples})


def pad(lw: Lowering, node: torch.fx.Node) -> Val:
    """constant_pad_nd (``Pad``, constant scheme); torch lists (before, after) pairs from the last dimension.

    A 4-D value is padded in NHWC (convolutions, its usual users, read NHWC). Measured on the HTP emulator's SoC
    device (quantized graphs): a ``Pad`` at the end of the innermost dimension of an NCHW tensor (torch's
    ``pad(x, (0, 1, 0, 1))`` before a stride-2 convolution, as MobileNetV2's "same" padding does) writes garbage
    into that padding (up to 250 output steps) when a ``Transpose`` + convolution follows it, or between a
    ``Dequantize`` and a ``Quantize``; padded in NHWC, where W is not innermost, it is right."""
    v = lw.value(node.args[0])
    v = lw.nhwc(v) if len(v.shape) == 4 else lw.nchw(v)
    flat = [int(p) for p in node.args[1]]
    amounts = np.zeros((len(v.shape), 2), np.uint32)
    for i in range(len(flat) // 2):
        amounts[len(v.shape) - 1 - i] = flat[2 * i:2 * i + 2]
    out = static_shape(node)
    params = {"scheme": 0, "pad_constant_value": float(arg(node, 2, "value", 0.0))}
    if v.nhwc:
        return lw.node("Pad", [v.name], tuple(out[i] for i in NCHW_TO_NHWC),
                       {"pad_amount": amounts[list(NCHW_TO_NHWC)], **params}, nhwc=True)
    return lw.node("Pad", [v.name], out, {"pad_amount": amounts, **params})


def cat(lw: Lowering, node: torch.fx.Node) -> Val:
    parts = node.args[0]
    out = static_shape(node)
    dim = int(arg(node, 1, "dim", 0)) % len(out)
    vals = [lw.value(p) for p in parts]
    if len(out) == 4 and all(v.nhwc for v in vals):
        phys = tuple(out[i] for i in NCHW_TO_NHWC)
        return lw.node("Concat", [v.name for v in vals], phys, {"axis": int(NCHW_TO_NHWC.index(dim))}, nhwc=True)
    names = [lw.nchw(v).name for v in vals]
    return lw.node("Concat", names, out, {"axis": dim})


LOWERINGS = {
    "aten.view_copy.default": reshape,
    "aten._unsafe_view.default": reshape,
    "aten.squeeze_copy.dims": reshape,
    "aten.squeeze_copy.dim": reshape,
    "aten.unsqueeze_copy.default": reshape,
    "aten.expand_copy.default": expand,
    "aten.split_with_sizes_copy.default": split,
    "aten.clone.default": reshape,
    "aten.permute_copy.default": permute,
    "aten.cat.default": cat,
    "aten.constant_pad_nd.default": pad,
    "aten.select_copy.int": select,
    "aten.slice_copy.Tensor": slice_,
}
