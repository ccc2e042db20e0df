"""edgeport.constraints on the nodes torch.export and to_edge really produce: what each check refuses, and why.

Every case exports a small module and applies the constraint to its edge node; the expectation is the rule the
helper encodes (written out here), never the helper's own output replayed.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import torch
import torch.nn.functional as F

from edgeport import constraints as c
from edgeport import to_edge
from edgeport.aot.capability_partitioner import op_name


class _Fn(torch.nn.Module):
    def __init__(self, fn):  # type: ignore[no-untyped-def]
        super().__init__()
        self.fn = fn

    def forward(self, *xs):  # type: ignore[no-untyped-def]
        return self.fn(*xs)


def _node(fn, *inputs, op: str, dynamic_shapes=None, edge: bool = True):  # type: ignore[no-untyped-def]
    """The one node of ``op`` in ``fn``'s edge graph (``edge=False``: its exported graph)."""
    module = fn if isinstance(fn, torch.nn.Module) else _Fn(fn)
    ep = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes)
    graph = (to_edge(ep).exported_program() if edge else ep).graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and op_name(n.target) == op]
    assert len(nodes) == 1, [op_name(n.target) for n in graph.nodes]
    return nodes[0]


_CONV = "aten.convolution.default"
x4 = torch.randn(1, 4, 8, 8)


def test_conv2d_dilation_refused_only_when_asked_with_the_dilation():
    node = _node(torch.nn.Conv2d(4, 4, 3, dilation=2), x4, op=_CONV)
    assert c.conv2d(node) is None
    assert c.conv2d(node, dilation=False) == "dilated convolution (dilation=[2, 2])"
    assert c.conv2d(_node(torch.nn.Conv2d(4, 4, 3), x4, op=_CONV), dilation=False) is None


def test_conv2d_groups_regular_and_depthwise_but_not_other_groupings():
    assert c.conv2d(_node(torch.nn.Conv2d(4, 8, 3), x4, op=_CONV)) is None
    assert c.conv2d(_node(torch.nn.Conv2d(4, 4, 3, groups=4), x4, op=_CONV)) is None  # depthwise
    grouped = _node(torch.nn.Conv2d(4, 4, 1, groups=2), x4, op=_CONV)
    assert c.conv2d(grouped) == "grouped convolution (groups=2) that is neither regular nor depthwise"
    assert c.conv2d(grouped, groups="any") is None


def test_conv2d_refuses_other_dimensions_and_transposed():
    one_d = _node(torch.nn.Conv1d(4, 4, 3), torch.randn(1, 4, 8), op=_CONV)
    assert c.conv2d(one_d) == "only 2-D convolutions (4-D weight) with static shapes"
    transposed = _node(torch.nn.ConvTranspose2d(4, 4, 2), x4, op=_CONV)
    assert c.conv2d(transposed) == "transposed convolution is not lowered"
    assert c.conv2d(_node(torch.nn.Conv2d(4, 4, 3), x4, op=_CONV), input_ranks=(3,)) is not None


def test_static_shapes_names_the_dynamic_tensor_and_the_backends_reason():
    dim = torch.export.Dim("n", min=2, max=16)
    node = _node(torch.relu, torch.randn(4, 3), op="aten.relu.default", dynamic_shapes=(({0: dim},),))
    why = c.static_shapes("AcmeNPU graphs are static")(node)
    assert why is not None and why.startswith("dynamic shape on ") and why.endswith(": AcmeNPU graphs are static")
    assert c.static_shapes("x")(_node(torch.relu, torch.randn(4, 3), op="aten.relu.default")) is None


def test_static_shapes_rank_and_empty_tensors():
    node = _node(torch.relu, torch.randn(1, 1, 1, 1, 2, 3), op="aten.relu.default")
    assert c.static_shapes("s", max_rank=6)(node) is None
    assert "has rank 6 > 5" in c.static_shapes("s", max_rank=5)(node)
    empty = _node(torch.relu, torch.randn(2, 0), op="aten.relu.default")
    assert c.static_shapes("s")(empty) is None
    assert c.static_shapes("s", empty="views only")(empty).endswith("[2, 0] has no elements: views only")


def test_max_rank_checks_inputs_too_and_skips_dynamic_shapes():
    node = _node(lambda x: x.reshape(6), torch.randn(1, 1, 1, 1, 2, 3), op="aten.view_copy.default")
    why = c.max_rank(5, "the NPU's tensors have rank 5 at most")(node)
    assert why is not None and "has rank 6 > 5 (the NPU's tensors have rank 5 at most)" in why  # the input
    assert c.max_rank(6)(node) is None


def test_max_pool2d_dilation_ceil_mode_and_used_indices():
    op = "aten.max_pool2d_with_indices.default"
    assert c.max_pool2d(_node(lambda x: F.max_pool2d(x, 2), x4, op=op)) is None
    dilated = _node(lambda x: F.max_pool2d(x, 2, dilation=2), x4, op=op)
    assert c.max_pool2d(dilated) == "dilated max pooling" and c.max_pool2d(dilated, dilation=True) is None
    ceil = _node(lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), x4, op=op)
    assert c.max_pool2d(ceil) == "ceil_mode=True" and c.max_pool2d(ceil, ceil_mode=True) is None
    indices = _node(lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(), x4, op=op)
    assert c.max_pool2d(indices).startswith("the indices output of ")


def test_first_output_only_on_layer_norm_statistics():
    op = "aten.native_layer_norm.default"
    plain = _node(lambda x: F.layer_norm(x, (8,)), torch.randn(2, 8), op=op)
    assert c.first_output_only(plain) is None
    stats = _node(lambda x: torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[1] * 2, torch.randn(2, 8),
                  op=op)
    assert c.first_output_only(stats).startswith("output [1] of ")


def test_avg_pool2d_ceil_mode_divisor_and_counted_padding():
    op = "aten.avg_pool2d.default"
    assert c.avg_pool2d(_node(lambda x: F.avg_pool2d(x, 2), x4, op=op)) is None
    assert c.avg_pool2d(_node(lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), x4, op=op)) == "ceil_mode=True"
    assert c.avg_pool2d(_node(lambda x: F.avg_pool2d(x, 2, divisor_override=3), x4, op=op)) == "divisor_override is set"
    counted = _node(lambda x: F.avg_pool2d(x, 3, 1, 1), x4, op=op)
    assert c.avg_pool2d(counted) is None
    assert c.avg_pool2d(counted, count_include_pad=False).startswith("padding counted in the average")
    valid = _node(lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), x4, op=op)
    assert c.avg_pool2d(valid, count_include_pad=False) is None


def test_adaptive_pool_alpha_padding_steps_softmax_gelu():
    op = "aten.adaptive_avg_pool2d.default"  # what backends keep whole (to_edge would decompose it)
    assert c.adaptive_avg_pool_1x1(_node(lambda x: F.adaptive_avg_pool2d(x, 1), x4, op=op, edge=False)) is None
    assert "to [2, 2], not 1x1" in c.adaptive_avg_pool_1x1(
        _node(lambda x: F.adaptive_avg_pool2d(x, 2), x4, op=op, edge=False))
    y = torch.randn(2, 3)
    assert c.alpha_one(_node(lambda a, b: torch.add(a, b, alpha=2), y, y, op="aten.add.Tensor")) == "alpha != 1"
    assert c.alpha_one(_node(lambda a, b: a - b, y, y, op="aten.sub.Tensor")) is None
    assert c.non_negative_padding(_node(lambda x: F.pad(x, (1, 1)), y, op="aten.constant_pad_nd.default")) is None
    assert c.non_negative_padding(_node(lambda x: F.pad(x, (-1, 1)), y, op="aten.constant_pad_nd.default"))
    step2 = _node(lambda x: x[:, ::2], y, op="aten.slice_copy.Tensor")
    assert c.positive_step(step2) is None and c.unit_step(step2) == "slice step 2 (step 1 only)"
    assert c.unit_step(_node(lambda x: x[:, 1:], y, op="aten.slice_copy.Tensor")) is None
    assert c.no_half_to_float(_node(lambda x: torch.softmax(x, -1), y, op="aten._softmax.default")) is None
    assert c.gelu_erf_or_tanh(_node(lambda x: F.gelu(x, approximate="tanh"), y, op="aten.gelu.default")) is None


def test_first_problem_returns_the_first_reason_in_order():
    node = _node(torch.nn.Conv2d(4, 4, 1, groups=2, dilation=2), x4, op=_CONV)
    dilation_first = c.first_problem(partial(c.conv2d, groups="any", dilation=False), c.conv2d)
    assert dilation_first(node).startswith("dilated convolution")
    assert c.first_problem(c.conv2d, partial(c.conv2d, dilation=False))(node).startswith("grouped convolution")
    y = torch.randn(2, 3)
    scaled = _node(lambda a, b: torch.add(a, b, alpha=2), y, y, op="aten.add.Tensor")
    assert c.first_problem(c.static_shapes("s"), c.alpha_one)(scaled) == "alpha != 1"


def test_constraints_import_without_torch():
    code = "import sys, edgeport.constraints; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
