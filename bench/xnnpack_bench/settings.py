"""Paths, model names and the team's reference numbers shared by the XNNPACK latency bench."""

from __future__ import annotations

import os
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
ROOT = BENCH_DIR.parent
REPORT = BENCH_DIR / "REPORT.md"
SECTION = "## XNNPACK latency"
BUSY_SECTION = "## XNNPACK latency, one core busy"  # bench/xnnpack.py --busy-core
MODELS = ["mlp", "mobilenet_v2", "mobilenet_v2_int8", "resnet18", "encoder"]
CNNS = {"mobilenet_v2", "mobilenet_v2_int8", "resnet18"}
# ExecuTorch + XNNPACK latency measured earlier by the team on this machine (ms); eager for the encoder
TEAM_ET_MS = {"mobilenet_v2": 2.65, "mobilenet_v2_int8": 3.8, "resnet18": 25.0, "encoder": 9.9}
TEAM_EAGER_MS = {"encoder": 6.3}
CACHE = Path(os.environ.get("EDGEPORT_BENCH_CACHE", "/tmp/edgeport-bench-cache"))
