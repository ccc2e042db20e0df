#!/usr/bin/env bash
# Installs everything edgeport's development needs into a virtual environment (default: .venv), from nothing.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

# System libraries of the XNNPACK backend (Debian packages; root, or sudo when available).
# A C compiler builds the backend's small C extension (edgeport_xnnpack._glue; optional, but the tests expect it).
apt_pkgs=""
for pkg in libxnnpack0 libpthreadpool0; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt_pkgs="$apt_pkgs $pkg"
done
command -v gcc >/dev/null 2>&1 || apt_pkgs="$apt_pkgs gcc"
if [ -n "$apt_pkgs" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q $apt_pkgs
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/pip --disable-pip-version-check -q"
# torch first and pinned: the CPU wheel of 2.13.0 (any other version would pull CUDA packages).
$PIP install "torch==2.13.0"
$PIP install -e ./core -e ./plugins/example -e ./backends-xnnpack
# Test tools, the quantization flow, and the test-only oracle (the stock ExecuTorch runtime).
$PIP install "pytest>=8" "hypothesis>=6" "setuptools>=70.1" wheel "torchao==0.18.0" "executorch==1.5.1" "transformers==5.24.0" "torch==2.13.0"
# the child process that runs programs on the stock ExecuTorch runtime (test-only: the one place importing executorch)
$PIP install --no-deps -e ./testing/edgeport-stockcheck

# --- flatbuffers releases side by side (test-only) -------------------------------------------------------------
# core/tests/program/test_flatbuffers_versions.py writes and reads programs with every Python flatbuffers release
# from 24.x up to the newest (the venv's own may be older: tosa-tools pins 25.2.10): each goes into its own directory,
# which the test puts first
# on a child interpreter's PYTHONPATH. Pure-Python wheels, a few hundred KB in all.
for fb_version in 24.3.6 24.3.7 24.3.25 24.12.23 25.1.21 25.1.24 25.2.10 25.9.23 25.12.19; do
  fb_dir="$VENV/flatbuffers-versions/$fb_version"
  if [ ! -f "$fb_dir/flatbuffers/__init__.py" ]; then
    $PIP install --no-deps --target "$fb_dir" "flatbuffers==$fb_version"
  fi
done

# --- backends' own installs ------------------------------------------------------------------------------------
# Each backend package beyond the core set keeps its installs (Debian packages, its SDK, its editable install) in
# scripts/install.d/<backend>.sh, sourced here in name order with VENV, PIP and SUDO set; each step idempotent.
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
for step in scripts/install.d/*.sh; do
  [ -e "$step" ] || continue
  # shellcheck source=/dev/null
  source "$step"
done
