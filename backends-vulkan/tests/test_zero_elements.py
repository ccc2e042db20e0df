"""Zero-element tensors: data movement takes them on the device, compute operators refuse them at partition time.

Hugging Face decoders start their KV cache as ``torch.tensor([])`` and concatenate the first keys onto it (torch
skips 1-D empty tensors in ``cat``); before, such a partition lowered and then failed at load ("tensor 4 has 0
elements").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vk_models import load, lower, rel_err

from edgeport.errors import ProgramError
from edgeport_vulkan.capabilities import capabilities
from edgeport_vulkan.partitioner import VulkanPartitioner
from edgeport_vulkan.runtime import VulkanExecutor
from edgeport_vulkan.schema import parse_blob, serialize_blob


class EmptyCache(torch.nn.Module):
    """Keys and values concatenated onto empty caches, as ``transformers``' ``DynamicLayer`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.k, self.v = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.keys, self.values = torch.tensor([]), torch.tensor([])

    def forward(self, x):
        k = torch.cat([self.keys.clone(), self.k(x).view(1, 2, -1, 4)], dim=-2)
        v = torch.cat([self.values.clone(), self.v(x).view(1, 2, -1, 4)], dim=-2)
        att = torch.softmax(k @ k.transpose(-1, -2), dim=-1)
        return (att @ v).squeeze(0)


class EmptySlice(torch.nn.Module):
    """A slice to nothing (data movement: delegated) and ``relu`` of it (compute: refused, with the reason)."""

    def forward(self, x):
        y = torch.tanh(x)
        empty = y[:, :0]
        return torch.cat([torch.relu(empty) + 1, y * 2], dim=1), empty


def _lowered(model: torch.nn.Module, x: torch.Tensor) -> tuple[VulkanPartitioner, bytes]:
    part = VulkanPartitioner()
    return part, lower(model, (x,), part)


def test_empty_caches_are_delegated_and_run(device):
    torch.manual_seed(0)
    model, x = EmptyCache().eval(), torch.randn(1, 6, 8)
    part, pte = _lowered(model, x)
    assert not part.rejections, part.rejections  # clone and cat of the empty caches included
    (got,) = load(pte).execute([x.numpy()])
    assert rel_err(np.asarray(got), model(x).detach().numpy()) <= 1e-4


def test_compute_on_an_empty_tensor_is_refused_at_partition_time(device):
    torch.manual_seed(0)
    model, x = EmptySlice().eval(), torch.randn(2, 5)
    part, pte = _lowered(model, x)
    refused = {name: why for name, why in part.rejections.items() if "no elements" in why}
    assert any(name.startswith("relu") for name in refused), part.rejections
    assert not any(name.startswith(("slice", "tanh", "mul")) for name in part.rejections), part.rejections
    got = load(pte).execute([x.numpy()])
    for g, w in zip(got, model(x), strict=True):
        assert np.asarray(g).shape == tuple(w.shape)
        np.testing.assert_allclose(np.asarray(g), w.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_the_table_refuses_compute_on_empty_tensors_by_reason():
    ep = torch.export.export(EmptySlice().eval(), (torch.randn(2, 5),))
    from edgeport import to_edge

    graph = to_edge(ep).exported_program().graph
    relu = next(n for n in graph.nodes if n.name.startswith("relu"))
    part = VulkanPartitioner()
    assert "no elements" in (part.check_node(relu) or "")
    assert capabilities() is not None


def test_a_blob_computing_on_an_empty_tensor_is_refused_at_init(device):
    torch.manual_seed(0)
    from vk_models import MLP

    from edgeport.program import load_pte

    blob = parse_blob(bytes(load_pte(lower(MLP(), (torch.randn(2, 8),), VulkanPartitioner())).delegate_data(0, 0)))
    blob.graph.values[blob.graph.input_ids[0]].value.dims = [0, 8]
    with pytest.raises(ProgramError, match="has no elements"):
        VulkanExecutor().init(memoryview(serialize_blob(blob.graph, bytes(blob.constant_bytes))), [])
