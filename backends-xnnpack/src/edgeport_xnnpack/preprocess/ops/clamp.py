"""relu / hardtanh / clamp -> fused into the producer's output range when possible, else XNNClamp."""

from __future__ import annotations

import math
from typing import Any

from edgeport_xnnpack.preprocess.builder import GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


def emit_clamp(b: GraphBuilder, node: Any, lo: float, hi: float) -> None:
    src = node.args[0]
    if b.fuse_clamp(src, lo, hi):
        b.set(node, b.env[src])
        return
    xv = b.val(src)
    out = b.new_val(xv.shape, xv.layout)
    b.add("XNNClamp", minmax=(lo, hi), input_id=xv.id, output_id=out.id, flags=0)
    b.set(node, out)


def _arg(node: Any, i: int, name: str, default: Any) -> Any:
    v = node.args[i] if len(node.args) > i else node.kwargs.get(name, default)
    return default if v is None else v


@lowers("aten.relu.default")
def relu(b: GraphBuilder, node: Any) -> None:
    emit_clamp(b, node, 0.0, math.inf)


@lowers("aten.hardtanh.default")
def hardtanh(b: GraphBuilder, node: Any) -> None:
    emit_clamp(b, node, float(_arg(node, 1, "min_val", -1.0)), float(_arg(node, 2, "max_val", 1.0)))


@lowers("aten.clamp.default")
def clamp(b: GraphBuilder, node: Any) -> None:
    emit_clamp(b, node, float(_arg(node, 1, "min", -math.inf)), float(_arg(node, 2, "max", math.inf)))
