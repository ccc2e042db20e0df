"""Compiles the GLSL compute shaders to SPIR-V when the package is built (wheel or editable install).

``src/edgeport_vulkan/shaders/<name>.comp`` -> ``src/edgeport_vulkan/spirv/<name>.spv`` (fp32 storage) and
``<name>_fp16.spv`` (``-DFP16``: fp16 storage, fp32 arithmetic) -- or the variants a shader lists in a
``// edgeport-variants: fp16 i32`` line (``i32``: ``-DINT32``, int32 / bool storage; an empty list: the plain
build only) -- with ``glslc`` (Debian package ``glslc``), each validated with ``spirv-val`` (package ``spirv-tools``); the .spv files are package data. Nothing is
compiled at import time. A .spv newer than its .comp is kept as is.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHADERS = ROOT / "src" / "edgeport_vulkan" / "shaders"
SPIRV = ROOT / "src" / "edgeport_vulkan" / "spirv"
TARGET_ENV = "vulkan1.1"
VARIANTS = {"": [], "_fp16": ["-DFP16"], "_i32": ["-DINT32"]}  # .spv name suffix -> extra glslc flags
DEFAULT_VARIANTS = ("", "_fp16")
DIRECTIVE = "// edgeport-variants:"


def variants_of(src: Path) -> list[str]:
    """The .spv suffixes a shader is built in: ``""`` plus those its ``// edgeport-variants:`` line names."""
    for line in src.read_text().splitlines()[:5]:
        if line.startswith(DIRECTIVE):
            names = line[len(DIRECTIVE):].split()
            unknown = [n for n in names if f"_{n}" not in VARIANTS]
            if unknown:
                raise SystemExit(f"edgeport-vulkan: {src.name}: unknown variants {unknown}")
            return ["", *(f"_{n}" for n in names)]
    return list(DEFAULT_VARIANTS)


def _tool(name: str, apt_package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"edgeport-vulkan: `{name}` is needed to compile the compute shaders to SPIR-V; "
                         f"install it with `apt-get install {apt_package}`")
    return path


def compile_shaders() -> list[Path]:
    """Compiles and validates every shader; returns the .spv paths."""
    sources = sorted(SHADERS.glob("*.comp"))
    if not sources:
        raise SystemExit(f"edgeport-vulkan: no shaders found in {SHADERS}")
    glslc = _tool("glslc", "glslc")
    spirv_val = _tool("spirv-val", "spirv-tools")
    SPIRV.mkdir(exist_ok=True)
    outputs = []
    for src, (suffix, flags) in ((s, (v, VARIANTS[v])) for s in sources for v in variants_of(s)):
        out = SPIRV / (src.stem + suffix + ".spv")
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            tmp = out.with_suffix(".spv.tmp")
            for cmd in ([glslc, "-fshader-stage=compute", f"--target-env={TARGET_ENV}", "-O", "-Werror", *flags,
                         "-o", str(tmp), str(src)],
                        [spirv_val, "--target-env", TARGET_ENV, str(tmp)]):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    tmp.unlink(missing_ok=True)
                    raise SystemExit(f"edgeport-vulkan: `{' '.join(cmd)}` failed:\n{proc.stdout}{proc.stderr}")
            tmp.replace(out)
        outputs.append(out)
    for stale in set(SPIRV.glob("*.spv")) - set(outputs):
        stale.unlink()
    return outputs


class BuildPyWithShaders(build_py):
    """build_py that compiles the shaders first (also runs for PEP 660 editable installs)."""

    def run(self) -> None:
        compile_shaders()
        super().run()


setup(cmdclass={"build_py": BuildPyWithShaders})
