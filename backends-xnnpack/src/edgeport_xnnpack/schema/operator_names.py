"""The profiling events ExecuTorch's XNNPACK delegate reports for a blob, predicted from the blob alone.

ExecuTorch's runtime (1.5.1 and the XNNPACK it ships) profiles a delegate call as one event per XNNPACK operator,
in the order of the blob's nodes; each event's delegate debug id is the operator's name (XNNPACK's operator
type and micro-kernel, e.g. ``"Fully Connected (NC, F32) GEMM"``) followed by ``" #k"``, ``k`` counting that
name from 1 within the delegate. A node XNNPACK fuses into its producer or consumer (a clamp into the operator
before it, a spatial zero padding into the convolution after it) has no operator and no event of its own.

:func:`stock_event_ids` gives, for each node of a graph, the event ids it may be reported under (several when
the name depends on the CPU: dynamically quantized operators run as ``QDU8`` on x86 CPUs with VNNI and as
``QD8`` elsewhere) and, for a fused node, the node whose event carries it. The names and fusions were read off
ExecuTorch 1.5.1's runtime profiling edgeport's programs (``backends-xnnpack/tests/test_debug_handles.py``
checks, per delegate call, that its events are the predicted ones in order). An XNNPACK that names an operator
otherwise leaves that operator's events unresolved; one that fuses a node this module does not expect shifts
the count of that name, and the events of that name after it are attributed to the wrong nodes.

Torch-free: the preprocess step writes the delegate map from it; executors may name their own events with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeport_xnnpack.schema.graph import (
    FP16,
    FP32,
    QBINT4,
    QCINT8,
    QDINT8,
    QINT8,
    QUINT8,
    Graph,
    TensorValue,
    XNode,
)

__all__ = ["StockEvents", "node_event_ids", "stock_event_ids"]

_UNARY = {
    "XNNSigmoid": "Sigmoid", "XNNFloor": "Floor", "XNNSquareRoot": "Square Root", "XNNCeiling": "Ceiling",
    "XNNHardswish": "HardSwish", "XNNLeakyReLU": "LeakyReLU", "XNNNegate": "Negate", "XNNSquare": "Square",
    "XNNELU": "ELU", "XNNAbs": "Abs", "XNNReciprocalSquareRoot": "Reciprocal Square Root", "XNNLog": "Log",
    "XNNGelu": "GELU", "XNNTanh": "TanH", "XNNExp": "Exp", "XNNSin": "Sine", "XNNCos": "Cosine",
    "XNNClamp": "Clamp",
}
_BINARY = {
    "XNNAdd": "Add", "XNNSubtract": "Subtract", "XNNMultiply": "Multiply", "XNNDiv": "Divide",
    "XNNMinimum": "Minimum", "XNNMaximum": "Maximum", "XNNPReLU": "PReLU",
}
# datatype -> the name XNNPACK's operator names use
_DT = {FP32: "F32", FP16: "F16", QINT8: "QS8", QUINT8: "QU8", QDINT8: "QD8"}
_POOL_DT = {FP32: "F32", FP16: "F16", QINT8: "S8", QUINT8: "U8"}
_X = {FP32: "X32", FP16: "X16", QINT8: "X8", QUINT8: "X8", QDINT8: "X8"}
# nodes whose output bounds XNNPACK folds a following clamp into
_CLAMP_PRODUCERS = {"XNNFullyConnected", "XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNAvgPooling2d",
                    "XNNMaxPooling2d", "XNNClamp"}
_CONVOLUTIONS = ("XNNConv2d", "XNNDepthwiseConv2d")
_DWCONV_MAX_TAPS = 25  # larger depthwise kernels run on the IGEMM path


@dataclass
class StockEvents:
    """Per node of a graph, the events ExecuTorch's XNNPACK delegate reports for it: one tuple of alternative
    ids per event (empty list: none of its own), and the node whose event also carries it (``fused_into``: node
    index -> node index) when XNNPACK fuses it."""

    events: list[list[tuple[str, ...]]]
    fused_into: dict[int, int]

    def keys(self) -> list[list[str]]:
        """Per node, every id it may be reported under."""
        return [[k for alternatives in node for k in alternatives] for node in self.events]


def _name(node: XNode, values: dict[int, TensorValue]) -> tuple[str, ...]:
    """The operator name(s) of one node, without the counter."""
    kind = node.kind

    def dt(field: str) -> int:
        value = values.get(node.get(field))
        return value.datatype if value is not None else 0

    out = values.get(node.outputs()[0])
    x = _X.get(out.datatype if out is not None else FP32, "X32")
    if kind in _UNARY:
        return (f"{_UNARY[kind]} (NC)",)
    if kind in _BINARY:
        return (f"{_BINARY[kind]} (ND)",)  # with output bounds, a clamp operator follows (stock_event_ids)
    if kind == "XNNFullyConnected":
        return _fully_connected(dt("input1_id"), values.get(node.get("filter_id")))
    if kind in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"):
        return _convolution(node, dt("input1_id"), values.get(node.get("filter_id")))
    if kind == "XNNBatchMatrixMultiply":
        return (f"Batch Matrix Multiply (NC, {_DT.get(dt('input1_id'), 'F32')}) GEMM",)
    if kind == "XNNSoftmax":
        return (f"Softmax (NC, {_DT.get(dt('input_id'), 'F32')})",)
    if kind == "XNNStaticReshape":
        return ("Static Reshape (NC)",)
    if kind == "XNNStaticTranspose":
        return (f"Transpose (ND, {x})",)
    if kind == "XNNStaticConstantPad":
        return (f"Constant Pad (ND, {x})",)
    if kind == "XNNStaticSlice":
        return (f"Slice (ND, {x})",)
    if kind in ("XNNCopy", "XNNConcatenate2", "XNNConcatenate3", "XNNConcatenate4", "XNNConcatenate5"):
        return (f"Copy (NC, {x})",)  # a concatenation is one copy operator per input, named by the first
    if kind == "XNNConvert":
        src, dst = dt("input_id"), out.datatype if out is not None else 0
        if dst == QDINT8:
            return (f"Convert (NC, {_DT.get(src, 'F32')}, QD8)", f"Convert (NC, {_DT.get(src, 'F32')}, QDU8)")
        return ("Convert (NC)",)
    if kind == "XNNAvgPooling2d":
        return (f"Average Pooling (NHWC, {_DT.get(dt('input_id'), 'F32')}) Average Pooling",)
    if kind == "XNNMaxPooling2d":
        return (f"Max Pooling (NHWC, {_POOL_DT.get(dt('input_id'), 'F32')})",)
    if kind == "XNNArgMaxPooling2d":
        return (f"ArgMax Pooling (NHWC, {_DT.get(dt('input_id'), 'F32')})",)
    if kind == "XNNGlobalAvgPooling2d":
        return ("Mean (ND) Reduce2",) if dt("input_id") in (FP32, FP16) else ("Mean (ND)",)
    if kind == "XNNStaticResizeBilinear2D":
        return ("Resize Bilinear (NHWC)",)
    return ()


def _fully_connected(src: int, filt: TensorValue | None) -> tuple[str, ...]:
    if filt is None:
        return ()
    static = filt.constant_buffer_idx != 0  # a filter computed at run time: XNNPACK's dynamic fully connected
    w = filt.datatype
    if src == QDINT8:
        kind = {QCINT8: "QC8W", QBINT4: "QB4W"}.get(w, "QC8W")
        return (f"Fully Connected (NC, QD8, F32, {kind}) GEMM", f"Fully Connected (NC, QDU8, F32, {kind}) GEMM")
    if src == QINT8:
        return ("Fully Connected (NC, QS8, QC8W) GEMM",) if w == QCINT8 else ("Fully Connected (NC, QS8) GEMM",)
    dynamic = "" if static else "Dynamic "
    return (f"{dynamic}Fully Connected (NC, {_DT.get(src, 'F32')}) GEMM",)


def _convolution(node: XNode, src: int, filt: TensorValue | None) -> tuple[str, ...]:
    w = filt.datatype if filt is not None else FP32
    if src == QDINT8:
        dts = ("QD8, F32, QC8W", "QDU8, F32, QC8W")
    elif src == QINT8:
        dts = ("QC8",) if w == QCINT8 else ("QS8",)
    else:
        dts = (_DT.get(src, "F32"),)
    if node.kind == "XNNConvTranspose2d":
        return tuple(f"Deconvolution (NHWC, {d})" for d in dts)
    g = node.get
    one_by_one = _one_by_one(node)
    if node.kind == "XNNDepthwiseConv2d" and g("kernel_height") * g("kernel_width") <= _DWCONV_MAX_TAPS:
        return tuple(f"Convolution (NHWC, {d}) DWConv" for d in dts)
    if _as_fully_connected(node, src):
        return _fully_connected(src, filt)
    return tuple(f"Convolution (NHWC, {d}) {'GEMM' if one_by_one else 'IGEMM'}" for d in dts)


def _one_by_one(node: XNode) -> bool:
    g = node.get
    return (g("kernel_height") == 1 and g("kernel_width") == 1 and g("subsampling_height") == 1
            and g("subsampling_width") == 1 and not any(g(p) for p in (
                "padding_top", "padding_right", "padding_bottom", "padding_left")))


def _as_fully_connected(node: XNode, src: int) -> bool:
    """A 1x1 convolution XNNPACK runs as a fully connected operator."""
    return node.kind == "XNNConv2d" and _one_by_one(node) and node.get("groups") == 1 and src != QDINT8


def _fusions(graph: Graph, values: dict[int, TensorValue]) -> dict[int, int]:
    """node index -> the node index whose XNNPACK operator absorbs it: a clamp into the operator producing its
    input, a spatial zero padding into the convolution reading it, a dynamic quantization into the fully
    connected operator reading it, a reshape into the reshape reading it."""
    producer: dict[int, int] = {}
    consumers: dict[int, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for o in n.outputs():
            producer[o] = i
        for v in set(n.inputs()):
            consumers.setdefault(v, []).append(i)
    external_out = set(graph.output_ids)
    fused: dict[int, int] = {}

    def only_user(i: int) -> int | None:
        out = graph.nodes[i].get("output_id")
        users = consumers.get(out, [])
        return users[0] if len(users) == 1 and out not in external_out else None

    for i, n in enumerate(graph.nodes):
        if n.kind == "XNNClamp":
            p = producer.get(n.get("input_id"))
            if p is not None and graph.nodes[p].kind in _CLAMP_PRODUCERS and p not in fused and only_user(p) == i:
                fused[i] = p
        elif n.kind == "XNNStaticReshape":
            p = producer.get(n.get("input_id"))
            if p is not None and graph.nodes[p].kind == "XNNStaticReshape" and only_user(p) == i:
                fused[p] = i
        elif n.kind == "XNNStaticConstantPad" and _spatial_zero_pad(n) and (c := only_user(i)) is not None:
            conv = graph.nodes[c]
            src = values.get(conv.get("input1_id"))
            if (conv.kind in _CONVOLUTIONS and conv.get("input1_id") == n.get("output_id")
                    and not _as_fully_connected(conv, src.datatype if src is not None else FP32)):
                fused[i] = c
        elif n.kind == "XNNConvert" and (out := values.get(n.get("output_id"))) is not None and out.datatype == QDINT8:
            c = only_user(i)
            if c is not None and graph.nodes[c].kind == "XNNFullyConnected":
                fused[i] = c
    for i in list(fused):  # chains (reshape -> reshape -> reshape): to the node that stays
        j = fused[i]
        while j in fused:
            j = fused[j]
        fused[i] = j
    return fused


def _spatial_zero_pad(node: XNode) -> bool:
    """A zero padding of the height and width of an NHWC tensor only (XNNPACK folds it into a convolution)."""
    pre, post = list(node.get("pre_paddings")), list(node.get("post_paddings"))
    return (node.get("padding_value") == 0 and len(pre) == 4 and len(post) == 4
            and pre[0] == post[0] == pre[3] == post[3] == 0)


def _bounded(node: XNode) -> bool:
    mm = node.output_min_max
    return mm is not None and (mm[0] != float("-inf") or mm[1] != float("inf"))


def stock_event_ids(graph: Graph) -> StockEvents:
    """The event ids ExecuTorch's XNNPACK delegate reports for each node of ``graph`` (see the module doc)."""
    values = {v.id_out: v for v in graph.values}
    fused = _fusions(graph, values)
    counts: dict[str, int] = {}

    def count(names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        return tuple(f"{name} #{counts[name]}" for name in names)

    events: list[list[tuple[str, ...]]] = []
    for i, node in enumerate(graph.nodes):
        names = () if i in fused else _name(node, values)
        row = [count(names)] if names else []
        if names and node.kind in _BINARY and _bounded(node):  # XNNPACK defines the bounds as a clamp after it
            row.append(count(("Clamp (NC)",)))
        events.append(row)
    return StockEvents(events, fused)


def node_event_ids(graph: Graph) -> dict[int, tuple[XNode, str]]:
    """``id(node) -> (node, the first id ExecuTorch's delegate reports it under)`` for the nodes of ``graph`` that
    have an event of their own: an executor that runs such a node alone identifies its event by that id, a key
    of the delegate map. The node is kept in the value so that the ``id`` stays its own."""
    events = stock_event_ids(graph).events
    return {id(n): (n, row[0][0]) for n, row in zip(graph.nodes, events, strict=True) if row}
