"""A partition computed only from constants (wav2vec2's weight-norm ``pow`` of a weight) is not delegated: the
lowering no longer fails with "output is a constant ...; nothing to compute", and the model matches eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime

transformers = pytest.importorskip("transformers")


def test_wav2vec2_weight_norm_lowers_and_matches_eager():
    from edgeport_xnnpack import XnnpackPartitioner

    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, conv_dim=(32, 32), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4)
    inner = transformers.Wav2Vec2Model(config).eval()

    class Speech(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).last_hidden_state

    model = Speech().eval()
    x = torch.randn(1, 1600)
    manager = edgeport.to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                                   partitioner=[XnnpackPartitioner()]).to_executorch()
    assert "XnnpackBackend" in manager.delegation_summary()
    got = Runtime.get().load_program(manager.buffer).load_method().execute([x.numpy()])[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
