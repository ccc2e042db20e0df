"""VulkanPartitioner / VulkanCompileOptions / the capability table: what is delegated, and why not."""

from __future__ import annotations

import pytest
import torch

import edgeport
from edgeport.backend import CompileSpec
from edgeport_vulkan.capabilities import capabilities
from edgeport_vulkan.options import VulkanCompileOptions
from edgeport_vulkan.partitioner import VulkanPartitioner


def _partition(model, example, part=None, dynamic_shapes=None):
    part = part or VulkanPartitioner()
    ep = torch.export.export(model.eval(), example, dynamic_shapes=dynamic_shapes)
    edgeport.to_edge_transform_and_lower(ep, partitioner=[part])
    return part


def test_options_round_trip_executorch_encoding():
    opts = VulkanCompileOptions(force_fp16=True)
    specs = opts.to_compile_specs()
    assert {s.key: s.value for s in specs} == {"force_fp16": b"\x01", "require_dynamic_shapes": b"\x00"}
    assert VulkanCompileOptions.from_compile_specs(specs) == opts
    # ExecuTorch's texture/memory keys are accepted and ignored, as ExecuTorch ignores unhandled keys
    assert VulkanCompileOptions.from_compile_specs(
        [CompileSpec("storage_type_override", b"\x00\x00\x00\x00")]) == VulkanCompileOptions()
    with pytest.raises(ValueError, match="unknown compile spec 'bogus'"):
        VulkanCompileOptions.from_compile_specs([CompileSpec("bogus", b"1")])
    with pytest.raises(ValueError, match="little-endian bool"):
        VulkanCompileOptions.from_compile_specs([CompileSpec("force_fp16", b"\x02")])
    with pytest.raises(ValueError, match="must be a bool"):
        VulkanCompileOptions(force_fp16="yes")


def test_partitioner_arguments():
    assert VulkanPartitioner({"force_fp16": True}).compile_options.force_fp16
    with pytest.raises(ValueError, match="unknown compile options"):
        VulkanPartitioner({"texture": 1})
    with pytest.raises(TypeError):
        VulkanPartitioner(42)


def test_table_names_the_core_ops():
    names = set(capabilities().op_names)
    for op in ("aten.convolution.default", "aten.linear.default", "aten.addmm.default", "aten.mm.default",
               "aten.bmm.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
               "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default", "aten.sigmoid.default",
               "aten.tanh.default", "aten.hardswish.default", "aten.gelu.default",
               "aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.avg_pool2d.default",
               "aten.mean.dim", "aten._softmax.default", "aten.native_layer_norm.default",
               "aten.view_copy.default", "aten.permute_copy.default", "aten.cat.default", "aten.slice_copy.Tensor",
               "aten.constant_pad_nd.default"):
        assert op in names
    # compute ops are float32; data movement, integer arithmetic, masks and indexing also int / bool
    # (capabilities_typed)
    from edgeport_vulkan.capabilities_typed import WIDENED

    for cap in capabilities().ops:
        if cap.op in ("aten.convolution.default", "aten.linear.default", "aten._softmax.default", "aten.mean.dim"):
            assert cap.dtypes == ("float32",)
        if cap.op in WIDENED:
            assert "int64" in cap.dtypes and "float32" in cap.dtypes


def test_rejections_carry_reasons():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.ConvTranspose2d(2, 2, 2, stride=2)

        def forward(self, x, i):
            y = torch.softmax(self.up(x), dim=1)          # transposed conv; softmax over a non-last dim
            z = torch.mean(y, dim=1)                      # a non-trailing reduction
            return z, i + 2**40                           # int64 arithmetic beyond int32

    part = _partition(M(), (torch.randn(1, 2, 4, 4), torch.ones(3, dtype=torch.int64)))
    reasons = " | ".join(part.rejections.values())
    assert "transposed convolution" in reasons
    assert "the shader normalizes the last dim only" in reasons
    assert "last dim(s) only" in reasons
    assert "outside int32" in reasons


def test_dynamic_shapes_are_refused():
    part = _partition(torch.nn.Linear(4, 4), (torch.randn(2, 4),),
                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    assert part.rejections and all("dynamic shape" in r for r in part.rejections.values())


def test_require_dynamic_shapes_delegates_nothing():
    part = _partition(torch.nn.Linear(4, 4), (torch.randn(2, 4),),
                      VulkanPartitioner(VulkanCompileOptions(require_dynamic_shapes=True)))
    assert part.rejections and all("static shapes only" in r for r in part.rejections.values())


def test_used_indices_and_full_addmm_bias_are_rejected():
    class M(torch.nn.Module):
        def forward(self, x, a, b, c):
            v, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
            return v, idx, torch.addmm(c, a, b)

    part = _partition(M(), (torch.randn(1, 1, 4, 4), torch.randn(3, 4), torch.randn(4, 2), torch.randn(3, 2)))
    reasons = " | ".join(part.rejections.values())
    assert "indices output" in reasons or "getitem of non-delegated node 'max_pool2d" in reasons
    assert "bias of shape [3, 2]" in reasons


def test_max_pool_with_unused_indices_is_delegated(device):
    from vk_models import lower, rel_err, run_pte

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)[0]

    x = torch.randn(1, 2, 7, 7)
    part = VulkanPartitioner()
    pte = lower(M(), (x,), part)
    assert not part.rejections
    assert rel_err(run_pte(pte, [x.numpy()])[0], M()(x).numpy()) == 0
