"""Boolean ops on TOSA FP (issue 25): ``eq.Scalar``, ``logical_not``, ``any.dim`` and ``where.self`` -- the
fully-masked-row guard of decomposed masked attention -- are delegated and match fp32 eager (oracle) on Arm's
TOSA reference model, both branches of the SELECT taken; the integer profile refuses them with the reason."""

from __future__ import annotations

import numpy as np
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport_arm import TosaCompileSpec, TOSAPartitioner

OPS = ("aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.where.self")


class MaskedRows(torch.nn.Module):
    """Softmax over scores whose first row is fully masked; that row is set to zero, as SDPA's decomposition
    does. A constant boolean condition (folded) selects between an activation and a literal."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (1, 5, 4)
        n = x.shape[1]
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        keep[0] = False
        scores = torch.where(keep, x @ x.transpose(1, 2), torch.tensor(float("-inf")))
        probs = torch.softmax(scores, -1)
        dead = torch.logical_not(torch.logical_not(scores == float("-inf")).any(-1, keepdim=True))
        return torch.where(dead, torch.zeros_like(probs), probs) @ x


def test_masked_row_guard_is_delegated_and_matches_eager():
    torch.manual_seed(0)
    model, x = MaskedRows(), torch.randn(1, 5, 4)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[partitioner]).to_executorch()
    assert not partitioner.rejections, partitioner.rejections
    assert "0 portable kernel calls" in program.delegation_summary(), program.delegation_summary()
    got = np.asarray(Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0])
    want = model(x).numpy()
    assert np.all(want[0, 0] == 0) and np.all(np.isfinite(want))  # the guard took both branches
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_boolean_ops_stay_on_the_cpu_in_an_integer_profile():
    x = torch.randn(1, 5, 4)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+INT"))
    to_edge_transform_and_lower(torch.export.export(MaskedRows(), (x,)), partitioner=[partitioner])
    reasons = [why for why in partitioner.rejections.values() if why.startswith(OPS[1:])]
    assert len(reasons) >= 5 and any("boolean masks are lowered in float graphs only" in why for why in reasons), \
        reasons
