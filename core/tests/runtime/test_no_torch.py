"""``edgeport.runtime`` works with torch blocked: a subprocess whose import system refuses ``torch``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

SCRIPT = textwrap.dedent("""
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch.") or name == "executorch" or name.startswith("executorch."):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTorch())

    import numpy as np
    import edgeport
    from edgeport.runtime import Runtime

    path, x_path, y_path = sys.argv[1:4]
    x = np.load(x_path)
    method = Runtime.get().load_program(path).load_method("forward")
    (y,) = method.execute([x])
    np.testing.assert_allclose(y, np.load(y_path), rtol=1e-5, atol=1e-6)
    (y2,) = edgeport.load(path).forward(x)
    np.testing.assert_allclose(y2, y)
    banned = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
    assert not banned, banned
    print("OK", method.profile.kernel_libraries["aten::addmm.out"])
""")


def test_runtime_without_torch(builder, tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    (tmp_path / "m.pte").write_bytes(builder.linear_relu(w, b).serialize())
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.maximum(x @ w.T + b, 0))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "m.pte"), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "OK portable" in proc.stdout
