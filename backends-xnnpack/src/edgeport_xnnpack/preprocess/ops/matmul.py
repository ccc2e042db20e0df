"""bmm -> XNNBatchMatrixMultiply ([B, M, K] x [B, K, N])."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


@lowers("aten.bmm.default")
def bmm(b: GraphBuilder, node: Any) -> None:
    a, c = b.value(node.args[0], NCHW), b.value(node.args[1], NCHW)
    out = b.output_of(node)
    b.add("XNNBatchMatrixMultiply", input1_id=a.id, input2_id=c.id, output_id=out.id, flags=0)
    b.set(node, out)
