"""Puts this folder on sys.path so the tests can import their helpers (coreml_models)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
