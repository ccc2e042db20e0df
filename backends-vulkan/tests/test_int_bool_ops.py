"""int32 / int64 / bool tensors on the Vulkan device: each op lowered with ``VulkanPartitioner``, run on edgeport's
runtime (lavapipe here) and compared with eager PyTorch (integers and bools exactly, floats within 1e-5).

The ops of a transformer's mask and position arithmetic (comparisons, ``where``, logical and bitwise ops, casts,
``full`` / ``arange`` / ``scalar_tensor``, integer ``add`` / views / ``cat``) and indexing (``embedding``,
``index_select``, ``index.Tensor``, ``gather``); out-of-range indices fail the run; int64 inputs outside int32 are
refused at the run; ``force_fp16`` keeps integer tensors on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vk_models import load, lower

from edgeport.errors import RuntimeExecutionError
from edgeport_vulkan.partitioner import VulkanPartitioner

torch.manual_seed(0)
X = torch.randn(2, 3, 5)
INTS = torch.randint(-4, 5, (2, 3, 5))
M = torch.rand(2, 3, 5) > 0.5
IDS = torch.randint(0, 10, (2, 6))


class Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, *xs):
        return self.fn(self, *xs)


CASES = {
    # comparisons: float, int, mixed, scalar operands
    "eq_ne_float": (lambda m, x, i: ((x > 0) == (x < 0.5), x != x * 2), (X, INTS), "eq"),
    "compare_int": (lambda m, x, i: (i < 2, i >= -1, i <= i[:1], i > 3), (X, INTS), "lt"),
    "compare_mixed": (lambda m, x, i: (x < i, i == 2.5, x.ge(i)), (X, INTS), "lt"),
    "logical": (lambda m, x, m2: (~m2, m2 & (x > 0), m2 | (x < 0), torch.logical_xor(m2, x > 1),
                                  torch.logical_not(x)), (X, M), "logical_not"),
    "bitwise_int": (lambda m, i, j: (i & j, i | 3, i ^ j, ~i), (INTS, INTS[:, :1] + 1), "bitwise_and"),
    "where": (lambda m, x, m2: (torch.where(m2, x, -x), torch.where(x > 0, 1.0, x),
                                torch.where(m2, torch.tensor(float("-inf")), torch.tensor(0.0))), (X, M), "where"),
    "where_int": (lambda m, i, m2: torch.where(m2, i, i * 2), (INTS, M), "where"),
    "casts": (lambda m, x, i: (x.to(torch.int64), (x * 3).int(), x.bool(), i.float(), i.bool(), (i > 0).long(),
                               (x > 0).float()), (X * 4, INTS), "_to_copy"),
    "int_arith": (lambda m, i, j: (i + j, i - 1, i * j, torch.maximum(i, j), torch.minimum(i, j - 2), i + 0.5,
                                   i / 2), (INTS, INTS[:1] + 2), "add"),
    "bool_arith": (lambda m, a, b: (a + b, a * b), (M, M[:1]), "add"),
    "int_views": (lambda m, i: (i.view(6, 5)[1:4:2], i.permute(2, 0, 1), i.unsqueeze(1).expand(2, 4, 3, 5),
                                torch.cat([i, i + 1], dim=1), i[:, 1], torch.nn.functional.pad(i, (1, 2), value=7)),
                  (INTS,), "cat"),
    "bool_views": (lambda m, b: (b.transpose(0, 2), b[:, None, :, :].expand(2, 2, 3, 5), torch.cat([b, ~b], 0)),
                   (M,), "cat"),
    "constants": (lambda m, x: (x + torch.arange(5), torch.arange(2, 11, 3) * 2, torch.full((2, 3), 7),
                                torch.full_like(x, -2.5), torch.ones(5, dtype=torch.bool) & (x[0, 0] > 0),
                                x * torch.arange(0.5, 3.0, 0.5)), (X,), "arange"),
    "embedding": (lambda m, ids: m.emb(ids) * 2, (IDS,), "embedding"),
    "index_select": (lambda m, x, j: (torch.index_select(x, 1, j), torch.index_select(x, 2, j)),
                     (X, torch.tensor([2, 0, 2])), "index_select"),
    "index_tensor": (lambda m, x, j: (x[:, j], x[j[:, 1:] - 1], x[:, :, j - 1]),
                     (X, torch.tensor([[2, 0], [1, 1]])), "index"),
    "gather": (lambda m, x, j: torch.gather(x, 2, j), (X, torch.randint(0, 5, (2, 2, 3))), "gather"),
    "cumsum_any": (lambda m, x, i, b: (torch.cumsum(i, 1), torch.cumsum(b, -1), torch.cumsum(x, 2), b.any(-1),
                                       (x > 1).any(1, keepdim=True), i.any(0)), (X, INTS, M), "cumsum"),
    # float, added with these: bilinear upsampling (the segmentation head's last CPU op)
    "upsample": (lambda m, x: (torch.nn.functional.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True),
                               torch.nn.functional.interpolate(x, size=(3, 11), mode="bilinear")),
                 (torch.randn(1, 3, 4, 5),), "upsample_bilinear2d"),
    "sin_cos": (lambda m, x: (torch.sin(x * 5), torch.cos(x * 5)), (X,), "sin"),
}


def _lower(name: str, part: VulkanPartitioner | None = None) -> tuple[torch.nn.Module, VulkanPartitioner, bytes]:
    fn, inputs, _ = CASES[name]
    part = part or VulkanPartitioner()
    torch.manual_seed(0)
    model = Fn(fn).eval()
    return model, part, lower(model, inputs, part)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_is_delegated_and_matches_eager(device, name):
    inputs = CASES[name][1]
    model, part, pte = _lower(name)
    assert not part.rejections, part.rejections  # every node of the case on the device
    with torch.no_grad():
        want = model(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = load(pte).execute([t.numpy() for t in inputs])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), w.numpy()
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind in "biu":
            assert g.dtype.kind == w.dtype.kind, (g.dtype, w.dtype)
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_embedding_index_out_of_range_fails_the_run(device):
    model, _, pte = _lower("embedding")
    method = load(pte)
    bad = IDS.clone()
    bad[1, 2] = 10
    with pytest.raises(RuntimeExecutionError, match="index is out of range"):
        method.execute([bad.numpy()])
    # the flag is cleared: the next good run is right again
    (got,) = method.execute([IDS.numpy()])
    np.testing.assert_allclose(np.asarray(got), model(IDS).detach().numpy(), rtol=1e-6)


def test_negative_index_wraps_for_index_tensor_only(device):
    model, _, pte = _lower("index_tensor")
    j = torch.tensor([[-1, 0], [-3, 2]])
    got = load(pte).execute([X.numpy(), j.numpy()])
    for g, w in zip(got, model(X, j), strict=True):
        np.testing.assert_array_equal(np.asarray(g), w.numpy())


def test_int64_input_outside_int32_is_refused_at_the_run(device):
    _, _, pte = _lower("int_arith")
    big = INTS.clone()
    big[0, 0, 0] = 2**40
    with pytest.raises(RuntimeExecutionError, match="outside the int32 range"):
        load(pte).execute([big.numpy(), INTS[:1].numpy() + 2])


def test_force_fp16_keeps_integer_tensors_on_the_cpu(device):
    model, part, pte = _lower("where", VulkanPartitioner({"force_fp16": True}))
    assert any("force_fp16" in why for why in part.rejections.values()), part.rejections
    inputs = CASES["where"][1]
    got = load(pte).execute([t.numpy() for t in inputs])
    for g, w in zip(got, model(*inputs), strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=2e-3, atol=2e-3)


def test_refusals_name_their_reason():
    class TwoIndices(torch.nn.Module):
        def forward(self, x, a, b):
            return x[a, b]

    from edgeport import to_edge

    ep = torch.export.export(TwoIndices(), (X, torch.tensor([0, 1]), torch.tensor([1, 2])))
    graph = to_edge(ep).exported_program().graph
    part = VulkanPartitioner()
    reasons = [part.check_node(n) for n in graph.nodes if n.op == "call_function" and "index" in str(n.target)]
    assert any("2 index tensors" in (r or "") for r in reasons), reasons
