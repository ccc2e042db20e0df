"""TOSA FP on transformer decoders (issue 25 item 3): GPT-2's Conv1D (``addmm``) and the squares / cubes of
RMSNorm and GELU (``pow``) are delegated; the program matches fp32 eager (oracle) on Arm's TOSA reference model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport_arm import TosaCompileSpec, TOSAPartitioner


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_fp_delegates_addmm_and_pow_and_matches_eager(name):
    pytest.importorskip("transformers")
    from edgeport.testing.architectures import ARCHITECTURES, assert_close_to_scale

    arch = ARCHITECTURES[name]()
    ep = torch.export.export(arch.model, arch.example_inputs)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch()
    kernels = program.delegation_summary()
    assert "addmm" not in kernels and "pow" not in kernels, kernels
    assert not partitioner.refusals
    out = Runtime.get().load_program(program.buffer).load_method("forward").execute(list(arch.example_inputs))[0]
    assert_close_to_scale(np.asarray(out), arch.model(*arch.example_inputs).detach().numpy(), name, 1e-5)


def test_pow_other_than_square_or_cube_stays_on_the_cpu():
    class Pow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.pow(x, 4) + torch.pow(x, 2)

    x = torch.randn(2, 3)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(Pow(), (x,)), partitioner=[partitioner]).to_executorch()
    assert any("exponent 4 (2 and 3 only)" in why for why in partitioner.rejections.values()), partitioner.rejections
    out = Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0]
    np.testing.assert_allclose(np.asarray(out), (x**4 + x**2).numpy(), rtol=1e-6, atol=1e-6)
