"""State of the machine and the repository: CPU, load, other processes' CPU use, git and library versions."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from .settings import ROOT


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> str:
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(os.cpu_count())


class CpuMeter:
    """Cores kept busy by *other* processes while a block ran: machine busy time from /proc/stat minus this
    process's CPU time, divided by the wall time."""

    def __enter__(self) -> CpuMeter:
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = time.perf_counter() - self.t0
        busy, own = self._busy() - self.busy0, self._own() - self.own0
        self.others = max(0.0, (busy - own) / wall) if wall > 0 and busy >= 0 else float("nan")
        self.own = own / wall if wall > 0 else float("nan")

    @staticmethod
    def _busy() -> float:
        try:
            f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return -1e9
        idle = f[3] + (f[4] if len(f) > 4 else 0)
        return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system


def wait_quiet(max_s: float, cores: float) -> float:
    """Sleep in 2 s samples until other processes use fewer than ``cores`` cores, at most ``max_s`` seconds."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        with CpuMeter() as cm:
            time.sleep(2.0)
        if cm.others < cores:
            break
    return time.perf_counter() - t0


def git_state(path: str) -> str:
    """'committed', 'uncommitted changes' or 'not yet committed' for a path of this repository."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT, capture_output=True)
        if tracked.returncode != 0:
            return "the working tree's file, not yet committed"
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=ROOT, capture_output=True)
        return "as committed" if diff.returncode == 0 else "the working tree's file, with uncommitted changes"
    except OSError:
        return "git state unknown"


def git_head() -> str:
    """Short HEAD commit, and whether the measured packages (core/, backends-xnnpack/) had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "core", "backends-xnnpack"], cwd=ROOT,
                               capture_output=True)
        return head.stdout.strip() + (" with uncommitted changes in core/ or backends-xnnpack/"
                                      if dirty.returncode else "")
    except OSError:
        return "unknown"


def libxnnpack_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libxnnpack0"], capture_output=True, text=True)
        return out.stdout.strip() or "n/a"
    except OSError:
        return "n/a"


def cpu_flags() -> str:
    """The SIMD flags of /proc/cpuinfo that decide XNNPACK's kernels (fma, sse4, avx*, amx*)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                keep = ("fma", "sse4", "avx", "f16c", "amx")
                return " ".join(f for f in line.split(":", 1)[1].split() if f.startswith(keep))
    except OSError:
        pass
    return "unknown"
