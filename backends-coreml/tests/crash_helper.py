"""A planted crash for the isolation tests: a module-level function the worker process imports (no torch)."""

from __future__ import annotations

import os
import signal


def segfault() -> None:
    """End the calling process as a native crash would."""
    os.kill(os.getpid(), signal.SIGSEGV)
