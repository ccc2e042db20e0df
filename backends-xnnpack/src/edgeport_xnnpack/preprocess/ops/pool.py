"""max_pool2d(_with_indices) / avg_pool2d -> XNNMaxPooling2d / XNNAvgPooling2d on NHWC."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import KEEP_DIMS, NHWC, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


def _pair(v: Any, default: Any) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and not v):
        v = default
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def emit_pool(b: GraphBuilder, node: Any, kind: str, kernel: list[int], stride: list[int], padding: list[int],
              dilation: list[int] | None = None) -> None:
    xv = b.value(node.args[0], NHWC)
    out = b.output_of(node, NHWC)
    fields = dict(padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1],
                  padding_right=padding[1], pooling_height=kernel[0], pooling_width=kernel[1],
                  stride_height=stride[0], stride_width=stride[1], input_id=xv.id, output_id=out.id,
                  flags=KEEP_DIMS)
    if dilation is not None:
        fields.update(dilation_height=dilation[0], dilation_width=dilation[1])
    b.add(kind, **fields)
    b.set(node, out)


def _arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@lowers("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
def max_pool(b: GraphBuilder, node: Any) -> None:
    kernel = _pair(node.args[1], None)
    emit_pool(b, node, "XNNMaxPooling2d", kernel, _pair(_arg(node, 2, "stride"), kernel),
              _pair(_arg(node, 3, "padding", 0), [0]), _pair(_arg(node, 4, "dilation", 1), [1]))


@lowers("aten.avg_pool2d.default")
def avg_pool(b: GraphBuilder, node: Any) -> None:
    kernel = _pair(node.args[1], None)
    emit_pool(b, node, "XNNAvgPooling2d", kernel, _pair(_arg(node, 2, "stride"), kernel),
              _pair(_arg(node, 3, "padding", 0), [0]))
