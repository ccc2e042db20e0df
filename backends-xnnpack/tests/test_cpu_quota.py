"""The default thread count respects a container's CPU quota: ``_threadpool.cpu_quota`` reads cgroup v2
``cpu.max`` and v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` along the process's cgroup path (files written
here stand in for /proc/self/cgroup and /sys/fs/cgroup), and ``native.default_num_threads`` caps the affinity mask
with it. Torch-free, no libXNNPACK needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeport_xnnpack import _threadpool, native


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2(tmp_path: Path, limits: dict[str, str], cgroup: str = "/kubepods/pod1/ctr") -> tuple[str, str]:
    root = tmp_path / "cg"
    for rel, text in limits.items():
        write(root / rel.strip("/") / "cpu.max", text)
    (root / cgroup.strip("/")).mkdir(parents=True, exist_ok=True)
    write(tmp_path / "self-cgroup", f"0::{cgroup}\n")
    return str(tmp_path / "self-cgroup"), str(root)


def test_v2_quota_rounds_up_and_takes_the_smallest_along_the_path(tmp_path):
    proc, root = v2(tmp_path, {"/": "max 100000\n", "/kubepods": "800000 100000\n",
                               "/kubepods/pod1": "250000 100000\n", "/kubepods/pod1/ctr": "max 100000\n"})
    assert _threadpool.cpu_quota(proc, root) == 3  # 2.5 CPUs -> 3 threads; the 8-CPU parent is not the limit


def test_v2_without_a_quota_and_fractions_below_one(tmp_path):
    proc, root = v2(tmp_path, {"/": "max 100000\n", "/kubepods/pod1/ctr": "max 100000\n"})
    assert _threadpool.cpu_quota(proc, root) is None
    proc, root = v2(tmp_path / "b", {"/kubepods/pod1/ctr": "50000 100000\n"})
    assert _threadpool.cpu_quota(proc, root) == 1  # half a CPU still runs one thread


def test_container_view_where_the_own_cgroup_is_the_mount_root(tmp_path):
    # inside a container /proc/self/cgroup names the host's path while /sys/fs/cgroup is the container's own group
    root = tmp_path / "cg"
    write(root / "cpu.max", "200000 100000\n")
    write(tmp_path / "self-cgroup", "0::/system.slice/docker-abc.scope\n")
    assert _threadpool.cpu_quota(str(tmp_path / "self-cgroup"), str(root)) == 2


def test_v1_quota(tmp_path):
    root = tmp_path / "cg"
    write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us", "150000\n")
    write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    write(tmp_path / "self-cgroup", "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/\n")
    assert _threadpool.cpu_quota(str(tmp_path / "self-cgroup"), str(root)) == 2


@pytest.mark.parametrize("text", ["", "garbage\n", "0::/a\n", "3:cpu,cpuacct:/x\n"])
def test_missing_or_malformed_files_mean_no_quota(tmp_path, text):
    write(tmp_path / "self-cgroup", text)
    root = tmp_path / "cg"
    write(root / "a" / "cpu.max", "lots of cpus\n")
    write(root / "cpu,cpuacct" / "x" / "cpu.cfs_quota_us", "many\n")
    assert _threadpool.cpu_quota(str(tmp_path / "self-cgroup"), str(root)) is None
    assert _threadpool.cpu_quota(str(tmp_path / "absent"), str(root)) is None


def test_default_threads_capped_by_the_quota(monkeypatch):
    monkeypatch.delenv("EDGEPORT_XNNPACK_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(_threadpool, "cpu_quota", lambda: 1)
    assert native.default_num_threads() == 1
    monkeypatch.setattr(_threadpool, "cpu_quota", lambda: cores + 7)
    assert native.default_num_threads() == cores  # a quota above the mask does not add threads
    monkeypatch.setattr(_threadpool, "cpu_quota", lambda: None)
    assert native.default_num_threads() == cores
    monkeypatch.setenv("EDGEPORT_XNNPACK_THREADS", "5")
    assert native.default_num_threads() == 5  # the explicit setting wins
