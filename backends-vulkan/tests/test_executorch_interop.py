"""Wire compatibility with ExecuTorch 1.5.1's Vulkan delegate (test-only oracle).

* ExecuTorch's own reader (``extract_vk_flatbuffer`` + ``flatbuffer_to_vk_graph``, i.e. ``flatc`` with its
  ``schema.fbs``) parses edgeport's blobs and sees the same operators, arguments, tensors and constants;
* programs lowered by ExecuTorch's ``VulkanPartitioner`` run on edgeport's runtime and match eager.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vk_models import CNN, MLP, Attention, lower, rel_err, run_pte

from edgeport_vulkan.partitioner import VulkanPartitioner
from edgeport_vulkan.schema import NAMED_DATA_OFFSET, VkTensor, parse_blob

pytestmark = pytest.mark.executorch


def _delegate_blobs(pte: bytes) -> list[bytes]:
    from edgeport.program import load_pte

    lp = load_pte(pte)
    plan = lp.program.execution_plan[0]
    assert all(d.id == "VulkanBackend" for d in plan.delegates)
    return [bytes(lp.delegate_data(0, i)) for i in range(len(plan.delegates))]


@pytest.mark.parametrize("name", ["mlp", "cnn", "attention"])
def test_executorch_reader_parses_edgeport_blobs(name):
    ser = pytest.importorskip("executorch.backends.vulkan.serialization.vulkan_graph_serialize")
    torch.manual_seed(0)
    model, shape = {"mlp": (MLP, (2, 8)), "cnn": (CNN, (1, 3, 8, 8)), "attention": (Attention, (1, 4, 16))}[name]
    pte = lower(model(), (torch.randn(*shape),), VulkanPartitioner())
    (blob,) = _delegate_blobs(pte)
    ours = parse_blob(blob).graph
    theirs = ser.flatbuffer_to_vk_graph(ser.extract_vk_flatbuffer(blob))
    assert [(c.name, list(c.args)) for c in theirs.chain] == [(c.name, list(c.args)) for c in ours.chain]
    assert list(theirs.input_ids) == ours.input_ids and list(theirs.output_ids) == ours.output_ids
    assert len(theirs.values) == len(ours.values)
    for a, b in zip(theirs.values, ours.values, strict=True):
        assert type(a.value).__name__ == type(b.value).__name__
        if isinstance(b.value, VkTensor):
            assert list(a.value.dims) == b.value.dims
            assert int(a.value.datatype) == b.value.datatype and a.value.constant_id == b.value.constant_id
    assert [(c.offset, c.length) for c in theirs.constants] == [(c.offset, c.length) for c in ours.constants]
    header = ser.VulkanDelegateHeader.from_bytes(blob[:30])
    assert header.is_valid() and header.bytes_offset + header.bytes_size <= len(blob)


def _et_lower(model, example, options=None):
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as EtVulkanPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model.eval(), example)
    return to_edge_transform_and_lower(ep, partitioner=[EtVulkanPartitioner(options)]).to_executorch().buffer


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "cnn", "attention"])
def test_executorch_programs_run_on_edgeport(device, name):
    """ExecuTorch's graphs: weights in named data, ``et_vk.conv_with_clamp``, ``et_vk.prepack``, int32 indices."""
    torch.manual_seed(0)
    model, shape = {"mlp": (MLP, (2, 8)), "cnn": (CNN, (1, 3, 8, 8)), "attention": (Attention, (1, 4, 16))}[name]
    m, x = model().eval(), torch.randn(*shape)
    pte = _et_lower(m, (x,))
    blobs = _delegate_blobs(pte)
    assert blobs
    g = parse_blob(blobs[0]).graph
    assert all(c.offset == NAMED_DATA_OFFSET for c in g.constants)  # ExecuTorch keeps weights in named data
    got = run_pte(pte, [x.numpy()])[0]
    assert rel_err(got, m(x).detach().numpy()) <= 1e-4


def test_executorch_style_blob_with_named_data_and_conv_with_clamp(device):
    """An ExecuTorch-shaped graph (named-data constants, ``et_vk.conv_with_clamp`` with DBL_MAX bounds,
    ``clone`` with a memory format, ``max_pool2d_with_indices`` with unused int32 indices) runs."""
    from edgeport_vulkan.runtime import VulkanExecutor
    from edgeport_vulkan.schema import (
        Bool,
        Double,
        Int,
        IntList,
        Null,
        OperatorCall,
        ValueList,
        VkBytes,
        VkGraph,
        VkValue,
        serialize_blob,
    )

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    T = lambda dims, cid=-1, dt=5: VkValue(VkTensor(datatype=dt, dims=dims, constant_id=cid, mem_obj_id=0))  # noqa: E731
    values = [T([4, 2, 3, 3], 0), T([4], 1), T([1, 2, 6, 6]), VkValue(IntList([1, 1])), VkValue(IntList([1, 1])),
              VkValue(IntList([1, 1])), VkValue(Bool(False)), VkValue(IntList([0, 0])), VkValue(Int(1)),
              VkValue(Double(0.0)), VkValue(Double(1.7976931348623157e308)), T([1, 4, 6, 6]),
              VkValue(IntList([2, 2])), VkValue(IntList([2, 2])), VkValue(IntList([0, 0])),
              T([1, 4, 3, 3]), T([1, 4, 3, 3], dt=3), VkValue(ValueList([15, 16])), VkValue(Null()), T([1, 4, 3, 3])]
    chain = [OperatorCall(0, "et_vk.conv_with_clamp.default", [2, 0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
             OperatorCall(1, "aten.max_pool2d_with_indices.default", [11, 12, 13, 14, 3, 6, 17]),
             OperatorCall(2, "aten.clone.default", [15, 18, 19])]
    graph = VkGraph(chain=chain, values=values, input_ids=[2], output_ids=[19],
                    constants=[VkBytes(NAMED_DATA_OFFSET, w.nbytes, "w"), VkBytes(NAMED_DATA_OFFSET, b.nbytes, "b")])
    named = {"w": memoryview(w.tobytes()), "b": memoryview(b.tobytes())}
    ex = VulkanExecutor()
    h = ex.init(memoryview(serialize_blob(graph, b"")), [], named_data=named.__getitem__)
    try:
        (got,) = ex.execute(h, [x])
    finally:
        ex.destroy(h)
    y = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1))
    want = torch.nn.functional.max_pool2d(y, 2).numpy()
    assert rel_err(got, want) <= 1e-5


@pytest.mark.slow
def test_executorch_program_with_unsupported_ops_is_refused_by_name(device):
    """ExecuTorch delegates nn.TransformerEncoderLayer's boolean NaN checks too; the shader library has no
    boolean ops, so loading names them (instead of running something else)."""
    from edgeport.errors import ProgramError

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    pte = _et_lower(layer, (torch.randn(1, 4, 16),))
    with pytest.raises(ProgramError, match="does not implement: 'aten.eq.Scalar', 'aten.logical_not.default'"):
        run_pte(pte, [np.zeros((1, 4, 16), np.float32)])


@pytest.mark.slow
def test_executorch_force_fp16_program_runs_on_edgeport(device):
    """ExecuTorch's force_fp16 graphs: every tensor FLOAT16, weights stored as fp16 bytes, I/O staged as FLOAT32."""
    from edgeport_vulkan import VulkanDevice

    if not VulkanDevice.get().info.fp16_storage:
        pytest.skip("the device has no 16-bit storage buffers")
    torch.manual_seed(0)
    m, x = MLP().eval(), torch.randn(2, 8)
    pte = _et_lower(m, (x,), {"force_fp16": True})
    g = parse_blob(_delegate_blobs(pte)[0]).graph
    assert {v.value.datatype for v in g.values if isinstance(v.value, VkTensor)} == {4}
    assert rel_err(run_pte(pte, [x.numpy()])[0], m(x).detach().numpy()) <= 1e-2
