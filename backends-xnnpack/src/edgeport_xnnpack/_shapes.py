"""Shape checks of natively defined nodes (torch-free).

The 2022 libXNNPACK sizes internal buffers from the dims a blob declares but computes what a node writes
from its input dims and parameters; a blob whose declared output is too small would make it write out of
bounds. So before a node is defined, its output dims (and weight dims) are recomputed here and compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from edgeport_xnnpack.schema.graph import INVALID_ID, XNode

_SAME_SHAPE = {"XNNSoftmax", "XNNSigmoid", "XNNFloor", "XNNCeiling", "XNNSquareRoot", "XNNHardswish",
               "XNNNegate", "XNNSquare", "XNNAbs", "XNNConvert", "XNNClamp", "XNNELU", "XNNLeakyReLU"}
_BINARY = {"XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum"}


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    if a == b:
        return tuple(a)  # the common case (what the loop below gives for equal shapes)
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(reversed(out))


def _window(size: int, pad: int, k: int, s: int, d: int) -> int:
    eff = (k - 1) * d + 1
    return (size + pad - eff) // s + 1 if size + pad >= eff else -1


def expected_output(node: XNode, dims: Callable[[int], tuple[int, ...]]) -> tuple[int, ...] | str:
    """The output dims ``node`` computes from its inputs, or a string saying what is inconsistent."""
    k, g = node.kind, node.get
    if k in _SAME_SHAPE:
        return dims(g("input_id"))
    if k in _BINARY or k == "XNNPReLU":
        a, b = dims(g("input1_id")), dims(g("input2_id"))
        if k == "XNNPReLU":
            return a if len(a) == 4 and b == (a[3],) else f"prelu slope {b} does not match input {a}"
        out = broadcast(a, b)
        return out if out is not None else f"shapes {a} and {b} do not broadcast"
    if k == "XNNFullyConnected":
        x, w = dims(g("input1_id")), dims(g("filter_id"))
        if len(w) != 2 or not x:
            return f"fully connected needs a 2-D filter and an input, got {x} x {w}"
        n_in, n_out = (w[0], w[1]) if g("flags") & 1 else (w[1], w[0])
        if g("bias_id") != INVALID_ID and dims(g("bias_id")) != (n_out,):
            return f"bias {dims(g('bias_id'))} does not match {n_out} outputs"
        if g("flags") & 4:
            numel = math.prod(x)
            return (numel // n_in, n_out) if n_in and numel % n_in == 0 else f"input {x} is not a multiple of {n_in}"
        return x[:-1] + (n_out,) if x[-1] == n_in else f"input {x} does not match filter {w}"
    if k in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"):
        return _conv(node, dims)
    if k in ("XNNMaxPooling2d", "XNNAvgPooling2d"):
        x = dims(g("input_id"))
        if len(x) != 4 or min(g("pooling_height"), g("pooling_width"), g("stride_height"), g("stride_width")) < 1:
            return f"pooling of input {x} with a zero window or stride"
        dh, dw = max(1, g("dilation_height")), max(1, g("dilation_width"))
        if g("flags") & 4:  # TensorFlow SAME padding
            return (x[0], -(-x[1] // g("stride_height")), -(-x[2] // g("stride_width")), x[3])
        oh = _window(x[1], g("padding_top") + g("padding_bottom"), g("pooling_height"), g("stride_height"), dh)
        ow = _window(x[2], g("padding_left") + g("padding_right"), g("pooling_width"), g("stride_width"), dw)
        return (x[0], oh, ow, x[3]) if oh > 0 and ow > 0 else f"pooling window larger than input {x}"
    if k == "XNNGlobalAvgPooling2d":
        x = dims(g("input_id"))
        if len(x) != 4:
            return f"global average pooling of a {len(x)}-D input"
        out = dims(g("output_id"))
        return (x[0], 1, 1, x[3]) if len(out) == 4 else (x[0], x[3])
    if k == "XNNStaticReshape":
        x, out = dims(g("input_id")), dims(g("output_id"))
        return out if math.prod(x) == math.prod(out) else f"reshape of {x} into {out}"
    if k == "XNNStaticConstantPad":
        x, pre, post = dims(g("input_id")), list(g("pre_paddings")), list(g("post_paddings"))
        if len(pre) != len(x) or len(post) != len(x):
            return f"pad needs {len(x)} pre and post paddings"
        return tuple(a + b + c for a, b, c in zip(x, pre, post, strict=True))
    if k == "XNNStaticResizeBilinear2D":
        x = dims(g("input_id"))
        return (x[0], g("new_height"), g("new_width"), x[3]) if len(x) == 4 else "resize of a non 4-D input"
    return f"no shape rule for {k}"


def _conv(node: XNode, dims: Callable[[int], tuple[int, ...]]) -> tuple[int, ...] | str:
    g = node.get
    x, w = dims(g("input1_id")), dims(g("filter_id"))
    kh, kw = g("kernel_height"), g("kernel_width")
    sh, sw = max(1, g("subsampling_height")), max(1, g("subsampling_width"))
    dh, dw = max(1, g("dilation_height")), max(1, g("dilation_width"))
    groups, gic, goc = g("groups"), g("group_input_channels"), g("group_output_channels")
    if len(x) != 4 or min(kh, kw, groups, gic, goc) < 1:
        return f"convolution of input {x} with zero kernel/groups/channels"
    if node.kind == "XNNDepthwiseConv2d":
        cout = goc * groups // gic if goc % gic == 0 else -1
        want_w, cin = (1, kh, kw, cout), groups
    elif node.kind == "XNNConv2d":
        cout, cin = groups * goc, groups * gic
        want_w = (cout, kh, kw, gic)
    else:
        cout, cin = groups * goc, groups * gic
        want_w = (cout, kh, kw, gic)
    if w != want_w:
        return f"filter {w} should be {want_w}"
    if g("bias_id") != INVALID_ID and dims(g("bias_id")) != (cout,):
        return f"bias {dims(g('bias_id'))} should be ({cout},)"
    if x[3] != cin:
        return f"input has {x[3]} channels, the convolution expects {cin}"
    if node.kind == "XNNConvTranspose2d":
        oh = sh * (x[1] - 1) + g("adjustment_height") + (kh - 1) * dh + 1 - g("padding_top") - g("padding_bottom")
        ow = sw * (x[2] - 1) + g("adjustment_width") + (kw - 1) * dw + 1 - g("padding_left") - g("padding_right")
    elif g("flags") & 4:
        oh, ow = -(-x[1] // sh), -(-x[2] // sw)
    else:
        oh = _window(x[1], g("padding_top") + g("padding_bottom"), kh, sh, dh)
        ow = _window(x[2], g("padding_left") + g("padding_right"), kw, sw, dw)
    return (x[0], oh, ow, cout) if oh > 0 and ow > 0 else f"kernel larger than the padded input {x}"


def check_native(node: XNode, dims: Callable[[int], tuple[int, ...]]) -> str | None:
    """``None`` when ``node``'s declared output dims are what it computes, else the problem."""
    want = expected_output(node, dims)
    if isinstance(want, str):
        return want
    got = dims(node.outputs()[0])
    return None if tuple(want) == tuple(got) else f"output dims {list(got)} should be {list(want)}"
