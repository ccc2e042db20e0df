"""The shader library: compiled at build time, valid SPIR-V, interfaces as the host code expects."""

from __future__ import annotations

import shutil
import struct
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
    "ewise": (4, 100), "gather": (4, 72), "scan": (2, 12),
    "upsample": (2, 32),
}
# build variants beyond the default ("", "_fp16"): the word-storage shaders have the plain build only, the data
# movers an int32 one too (their `// edgeport-variants:` lines)
SUFFIXES = {"ewise": ("",), "gather": ("",), "scan": ("",), "copy": ("", "_fp16", "_i32"), "permute": ("", "_fp16", "_i32"),
            "fill": ("", "_fp16", "_i32")}
VARIANTS = [f"{name}{suffix}" for name in sorted(EXPECTED) for suffix in SUFFIXES.get(name, ("", "_fp16"))]


def test_every_shader_is_compiled():
    assert SOURCES == sorted(EXPECTED)
    built = sorted(p.name[:-4] for p in PKG.joinpath("spirv").iterdir() if p.name.endswith(".spv"))
    assert built == sorted(VARIANTS), "stale or missing .spv files: rebuild (pip install -e ./backends-vulkan)"


@pytest.mark.parametrize("name", VARIANTS)
def test_spirv_valid_and_interface(name):
    code = PKG.joinpath("spirv", f"{name}.spv").read_bytes()
    iface = reflect(code)
    assert (iface.bindings, iface.push_constant_size) == EXPECTED[name.removesuffix("_fp16").removesuffix("_i32")]
    words = struct.unpack(f"<{len(code) // 4}I", code)
    capabilities = {words[i + 1] for i in range(5, len(words) - 1) if words[i] == (2 << 16) | 17}  # OpCapability
    # Shader (+ StorageBuffer16BitAccess for fp16 storage); never Float16 arithmetic (a separate device feature)
    assert capabilities == ({1, 4433} if name.endswith("_fp16") else {1})
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
