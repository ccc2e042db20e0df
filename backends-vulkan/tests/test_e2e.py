"""torch.export -> VulkanPartitioner -> edgeport program -> edgeport runtime on the Vulkan device, vs eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vk_models import CNN, MLP, Attention, load, lower, rel_err, run_pte

from edgeport_vulkan import VulkanDevice
from edgeport_vulkan.options import VulkanCompileOptions
from edgeport_vulkan.partitioner import VulkanPartitioner

CASES = {
    "mlp": (MLP, (2, 8)),
    "cnn": (CNN, (1, 3, 8, 8)),
    "attention": (Attention, (1, 4, 16)),
}


def _case(name: str, fp16: bool = False):
    torch.manual_seed(0)
    cls, shape = CASES[name]
    model = cls().eval()
    x = torch.randn(*shape)
    part = VulkanPartitioner(VulkanCompileOptions(force_fp16=fp16))
    pte = lower(model, (x,), part)
    return model, x, part, pte


@pytest.mark.parametrize("name", sorted(CASES))
def test_fp32_matches_eager(device, name):
    model, x, part, pte = _case(name)
    assert not part.rejections, part.rejections  # fully delegated
    method = load(pte)
    assert [d.backend_id for d in method.profile.delegates] == ["VulkanBackend"]
    assert "Vulkan compute on" in method.profile.delegates[0].execution
    got = np.asarray(method.execute([x.numpy()])[0])
    want = model(x).detach().numpy()
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-4
    again = np.asarray(method.execute([x.numpy()])[0])  # the recorded command buffer is reused
    np.testing.assert_array_equal(again, got)
    x2 = torch.randn(*x.shape)
    assert rel_err(np.asarray(method.execute([x2.numpy()])[0]), model(x2).detach().numpy()) <= 1e-4


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_fp16_storage_matches_eager(device, name):
    if not VulkanDevice.get().info.fp16_storage:
        pytest.skip("the device has no 16-bit storage buffers")
    model, x, _, pte = _case(name, fp16=True)
    method = load(pte)
    assert "fp16 storage" in method.profile.delegates[0].execution
    got = np.asarray(method.execute([x.numpy()])[0])
    assert got.dtype == np.float32
    assert rel_err(got, model(x).detach().numpy()) <= 1e-2


def test_transformer_encoder_layer_fully_delegated(device):
    """nn.TransformerEncoderLayer: matmuls, softmax, layer norms, the FFN and the fast path's boolean NaN checks
    (eq / any / where on bool tensors, which stayed on the CPU before int / bool tensors) all run on Vulkan."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(1, 4, 16)
    part = VulkanPartitioner()
    pte = lower(layer, (x,), part)
    assert not part.rejections, part.rejections
    got = run_pte(pte, [x.numpy()])[0]
    assert rel_err(got, layer(x).detach().numpy()) <= 1e-4


def test_mixed_ops_and_scalars(device):
    class M(torch.nn.Module):
        def forward(self, x, y):
            z = torch.cat([x * 0.5 + 1.0, torch.sigmoid(y) - x], dim=1)
            z = torch.nn.functional.pad(z, (1, 2))
            z = torch.clamp(z[:, 1:5], -0.5, 0.75) / (torch.tanh(z[:, :4]) + 2.0)
            return z.permute(1, 0).mean(dim=-1, keepdim=True), torch.nn.functional.hardtanh(z, -0.2, 0.3)

    torch.manual_seed(1)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    part = VulkanPartitioner()
    pte = lower(M(), (x, y), part)
    assert not part.rejections, part.rejections
    got = run_pte(pte, [x.numpy(), y.numpy()])
    for g, w in zip(got, M()(x, y), strict=True):
        assert rel_err(g, w.numpy()) <= 1e-4


def test_batch_norm_is_folded_at_load_and_mobilenet_is_one_delegate():
    """MobileNetV2 (eval batch norms after every convolution) lowers to one delegate and matches eager."""
    import numpy as np
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport.runtime import Runtime
    from edgeport.testing.models import mobilenet_v2_style
    from edgeport_vulkan import VulkanPartitioner

    model, args = mobilenet_v2_style()
    program = to_edge_transform_and_lower(torch.export.export(model, args),
                                          partitioner=[VulkanPartitioner()]).to_executorch()
    summary = program.delegation_summary()
    assert "delegated to VulkanBackend: 1 call(s)" in summary and "0 portable kernel calls" in summary, summary
    got = Runtime.get().load_program(program.buffer).load_method("forward").execute([args[0].numpy()])[0]
    want = model(*args).detach().numpy()
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


class RMSNormPow(torch.nn.Module):
    """Llama's RMSNorm (pow 2, mean, rsqrt) and pow with other exponents, on negative and zero bases too."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return norm + x.pow(3) - x.pow(-2.0) + x.abs().pow(0.5) + x.pow(0)


def test_rmsnorm_and_pow_run_on_the_device(device):
    torch.manual_seed(0)
    model = RMSNormPow().eval()
    x = torch.randn(2, 4, 16) + 0.1
    x[0, 0, :3] = torch.tensor([-2.0, -0.5, 3.0])
    part = VulkanPartitioner()
    pte = lower(model, (x,), part)
    assert not part.rejections, part.rejections
    got = np.asarray(load(pte).execute([x.numpy()])[0])
    assert rel_err(got, model(x).detach().numpy()) <= 1e-4
