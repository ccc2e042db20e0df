"""The shader library: compiled at build time, valid SPIR-V, interfaces as the host code expects."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from edgeport_vulkan.spirv import reflect

PKG = resources.files("edgeport_vulkan")
SOURCES = sorted(p.name[:-5] for p in PKG.joinpath("shaders").iterdir() if p.name.endswith(".comp"))
EXPECTED = {  # shader -> (bindings, push-constant bytes)
    "binary": (3, 76), "unary": (2, 12), "matmul": (4, 28), "conv2d": (4, 76), "pool2d": (2, 60), "mean": (2, 8),
    "softmax": (2, 12), "layer_norm": (4, 20), "permute": (2, 56), "copy": (2, 88), "fill": (1, 8),
}


def test_every_shader_is_compiled():
    assert SOURCES == sorted(EXPECTED)
    for name in SOURCES:
        assert PKG.joinpath("spirv", f"{name}.spv").is_file(), f"{name}.spv missing: rebuild (pip install -e)"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_spirv_valid_and_interface(name):
    code = PKG.joinpath("spirv", f"{name}.spv").read_bytes()
    iface = reflect(code)
    assert (iface.bindings, iface.push_constant_size) == EXPECTED[name]
    assert iface.push_constant_size <= 128  # the minimum maxPushConstantsSize every device guarantees
    if shutil.which("spirv-val") is None:
        pytest.skip("spirv-val not installed (apt-get install spirv-tools)")
    spv = Path(str(PKG.joinpath("spirv", f"{name}.spv")))
    proc = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(spv)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_reflect_rejects_garbage():
    with pytest.raises(ValueError):
        reflect(b"\x00" * 64)


def test_import_touches_no_vulkan_api():
    code = "import sys, edgeport_vulkan; assert 'vulkan' not in sys.modules, 'vulkan imported at import time'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
