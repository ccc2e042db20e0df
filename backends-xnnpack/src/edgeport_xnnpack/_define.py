"""Define one blob node in a native XNNPACK subgraph, translated to this library's (2022) definer API.

Torch-free. ``native_kind_ok`` says whether a node can run natively here; ``define_node`` calls the definer.
Flags are translated: ``XNN_FLAG_KEEP_DIMS`` (newer XNNPACK) is the 2022 pooling behaviour and dropped, a global
average pooling without it gets a reshape after it; unknown flags are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from edgeport_xnnpack import native
from edgeport_xnnpack._dynamic_quant import DYNAMIC_ROWS
from edgeport_xnnpack._rewrite_int8 import INT8_MEAN
from edgeport_xnnpack.schema.graph import INVALID_ID, XNode

KEEP_DIMS = 0x40
SAME = native.FLAG_TENSORFLOW_SAME_PADDING

_BINARY = {"XNNAdd": "add2", "XNNSubtract": "subtract", "XNNMultiply": "multiply2", "XNNDiv": "divide"}
_BINARY_NO_MINMAX = {"XNNMinimum": "minimum2", "XNNMaximum": "maximum2"}
_UNARY = {
    "XNNSoftmax": "softmax", "XNNSigmoid": "sigmoid", "XNNFloor": "floor", "XNNCeiling": "ceiling",
    "XNNSquareRoot": "square_root", "XNNHardswish": "hardswish", "XNNNegate": "negate", "XNNSquare": "square",
    "XNNAbs": "abs", "XNNConvert": "convert",
}
# node kind -> flags the 2022 definer accepts (after dropping KEEP_DIMS where noted)
_ALLOWED_FLAGS = {
    "XNNConv2d": SAME, "XNNDepthwiseConv2d": SAME, "XNNFullyConnected": 0x1 | 0x4,
    "XNNMaxPooling2d": SAME | KEEP_DIMS, "XNNAvgPooling2d": SAME | KEEP_DIMS, "XNNGlobalAvgPooling2d": KEEP_DIMS,
    "XNNStaticResizeBilinear2D": 0x4 | 0x8,
}
_OTHER = {"XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNFullyConnected", "XNNClamp",
          "XNNMaxPooling2d", "XNNAvgPooling2d", "XNNGlobalAvgPooling2d", "XNNStaticReshape", "XNNStaticConstantPad",
          "XNNStaticResizeBilinear2D", "XNNELU", "XNNLeakyReLU", "XNNPReLU"}
NATIVE_KINDS = frozenset({*_BINARY, *_BINARY_NO_MINMAX, *_UNARY, *_OTHER})


def _minmax(node: XNode) -> tuple[float, float]:
    if node.output_min_max is None:
        return -math.inf, math.inf
    lo, hi = node.output_min_max
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"bad output range ({lo}, {hi})")
    return lo, hi


def native_kind_ok(node: XNode, is_static: Callable[[int], bool], lib: native.Library) -> str | None:
    """``None`` if this library can define ``node`` natively, else why not (the node then runs on the host)."""
    if node.kind not in NATIVE_KINDS:
        return f"this libXNNPACK has no {node.kind} node"
    if DYNAMIC_ROWS in node.fields:
        return "this libXNNPACK has no qdint8 (dynamic int8) conversion; emulated on the host"
    if INT8_MEAN in node.fields:
        return "this libXNNPACK rounds int8 means differently from newer XNNPACK; emulated on the host"
    flags = node.get("flags")
    allowed = _ALLOWED_FLAGS.get(node.kind, 0)
    if flags & ~allowed:
        return f"{node.kind}: flags {flags:#x} are not supported by this libXNNPACK"
    if node.kind == "XNNFullyConnected":
        if not is_static(node.get("filter_id")) or (
            node.get("bias_id") != INVALID_ID and not is_static(node.get("bias_id"))
        ):
            return "fully connected with a non-constant filter or bias (this libXNNPACK packs static weights only)"
    return None


def define_node(sg: native.Subgraph, node: XNode, ids: dict[int, int], out_dims: dict[int, tuple[int, ...]],
                new_internal: Callable[[tuple[int, ...]], int],
                io: tuple[list[int], list[int]] | None = None) -> None:
    """Define ``node`` in ``sg``; ``ids`` maps blob value ids to subgraph ids (``INVALID_ID`` to itself); ``io``:
    the node's ``(inputs(), outputs())`` when the caller has them."""
    k, g = node.kind, node.get

    def v(name: str) -> int:
        return ids[g(name)]

    lo, hi = _minmax(node)
    node_ins, node_outs = io if io is not None else (node.inputs(), node.outputs())
    ins = [ids[i] for i in node_ins]
    outs = [ids[o] for o in node_outs]
    if k in _BINARY:
        sg.define(_BINARY[k], lo, hi, v("input1_id"), v("input2_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k in _BINARY_NO_MINMAX:
        sg.define(_BINARY_NO_MINMAX[k], v("input1_id"), v("input2_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k == "XNNPReLU":
        sg.define("prelu", v("input1_id"), v("input2_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k in _UNARY:
        sg.define(_UNARY[k], v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
        if node.output_min_max is not None and (lo > -math.inf or hi < math.inf):
            raise ValueError(f"{k} with a fused output range is not supported")
    elif k == "XNNClamp":
        sg.define("clamp", lo, hi, v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k == "XNNELU":
        sg.define("elu", g("alpha"), v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k == "XNNLeakyReLU":
        sg.define("leaky_relu", g("negative_slope"), v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k == "XNNFullyConnected":
        sg.define("fully_connected", lo, hi, v("input1_id"), v("filter_id"), v("bias_id"), v("output_id"),
                  g("flags") & 0x5, inputs=ins, outputs=outs)
    elif k in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"):
        _conv(sg, node, v, lo, hi, ins, outs)
    elif k in ("XNNMaxPooling2d", "XNNAvgPooling2d"):
        pads = [g("padding_top"), g("padding_right"), g("padding_bottom"), g("padding_left")]
        win = [g("pooling_height"), g("pooling_width"), g("stride_height"), g("stride_width")]
        if k == "XNNMaxPooling2d":
            dil = [max(1, g("dilation_height")), max(1, g("dilation_width"))]
            sg.define("max_pooling_2d", *pads, *win, *dil, lo, hi, v("input_id"), v("output_id"), g("flags") & SAME,
                      inputs=ins, outputs=outs)
        else:
            if max(g("dilation_height"), g("dilation_width")) > 1:
                raise ValueError("dilated average pooling is not supported")
            sg.define("average_pooling_2d", *pads, *win, lo, hi, v("input_id"), v("output_id"), g("flags") & SAME,
                      inputs=ins, outputs=outs)
    elif k == "XNNGlobalAvgPooling2d":
        dims = out_dims[g("output_id")]
        if len(dims) == 4:
            sg.define("global_average_pooling_2d", lo, hi, v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
        else:  # newer XNNPACK without KEEP_DIMS drops H and W: pool to [N, 1, 1, C], then reshape
            in_dims = sg.shapes[v("input_id")][1]
            if len(in_dims) != 4:
                raise ValueError(f"global average pooling needs a 4-D input, got {in_dims}")
            tmp = new_internal((in_dims[0], 1, 1, in_dims[3]))
            sg.define("global_average_pooling_2d", lo, hi, v("input_id"), tmp, 0, inputs=ins, outputs=[tmp])
            sg.define("static_reshape", len(dims), list(dims), tmp, v("output_id"), 0, inputs=[tmp], outputs=outs)
    elif k == "XNNStaticReshape":
        dims = out_dims[g("output_id")]  # the output value's dims (newer blobs may use 0 for "infer")
        sg.define("static_reshape", len(dims), list(dims), v("input_id"), v("output_id"), 0, inputs=ins, outputs=outs)
    elif k == "XNNStaticConstantPad":
        pre, post = list(g("pre_paddings")), list(g("post_paddings"))
        rank = len(sg.shapes[v("input_id")][1])
        if len(pre) != rank or len(post) != rank:
            raise ValueError(f"constant pad needs {rank} pre/post paddings, got {len(pre)}/{len(post)}")
        sg.define("static_constant_pad", pre, post, g("padding_value"), v("input_id"), v("output_id"), 0,
                  inputs=ins, outputs=outs)
    elif k == "XNNStaticResizeBilinear2D":
        sg.define("static_resize_bilinear_2d", g("new_height"), g("new_width"), v("input_id"), v("output_id"),
                  g("flags") & 0xC, inputs=ins, outputs=outs)
    else:
        raise ValueError(f"{k} cannot be defined natively")


def _conv(sg: native.Subgraph, node: XNode, v: Callable[[str], int], lo: float, hi: float,
          ins: list[int], outs: list[int]) -> None:
    g = node.get
    pads = [g("padding_top"), g("padding_right"), g("padding_bottom"), g("padding_left")]
    kernel = [g("kernel_height"), g("kernel_width")]
    stride = [max(1, g("subsampling_height")), max(1, g("subsampling_width"))]
    dil = [max(1, g("dilation_height")), max(1, g("dilation_width"))]
    gic, goc, groups = g("group_input_channels"), g("group_output_channels"), g("groups")
    tail = (v("input1_id"), v("filter_id"), v("bias_id"), v("output_id"))
    if node.kind == "XNNConv2d":
        sg.define("convolution_2d", *pads, *kernel, *stride, *dil, groups, gic, goc, lo, hi, *tail,
                  g("flags") & SAME, inputs=ins, outputs=outs)
    elif node.kind == "XNNDepthwiseConv2d":
        if gic == 0 or goc % gic:
            raise ValueError(f"depthwise convolution: {goc} output channels per group is not a multiple of {gic}")
        sg.define("depthwise_convolution_2d", *pads, *kernel, *stride, *dil, goc // gic, groups, lo, hi, *tail,
                  g("flags") & SAME, inputs=ins, outputs=outs)
    else:
        adj = [g("adjustment_height"), g("adjustment_width")]
        sg.define("deconvolution_2d", *pads, *adj, *kernel, *stride, *dil, groups, gic, goc, lo, hi, *tail, 0,
                  inputs=ins, outputs=outs)


def check_static_ids(node: XNode, is_static: Callable[[int], bool]) -> str | None:
    """Convolution weights must be constants (XNNPACK packs them when the runtime is created)."""
    if node.kind in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"):
        if not is_static(node.get("filter_id")):
            return f"{node.kind} with a non-constant filter"
        if node.get("bias_id") != INVALID_ID and not is_static(node.get("bias_id")):
            return f"{node.kind} with a non-constant bias"
    return None

