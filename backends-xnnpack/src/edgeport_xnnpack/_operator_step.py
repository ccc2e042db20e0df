"""A step run by one XNNPACK operator (the operator API, not a runtime): a channel shuffle
(:class:`edgeport_xnnpack._steps.ShuffleStep`) or a shared fully connected one
(:class:`edgeport_xnnpack._fc_ops.FullyConnectedStep`). ``op`` has ``run(src, dst)``, ``glue`` and ``close()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OperatorStep"]


@dataclass
class OperatorStep:
    """One operator reading value ``src`` and writing value ``dst``."""

    op: Any
    src: int
    dst: int
    label: str
    debug_handles: tuple[int, ...] = ()
    event_id: str = ""

    def run(self, env: dict[int, np.ndarray]) -> None:
        self.op.run(env[self.src], env[self.dst])

    def glue(self) -> tuple[Any, list[int]] | None:
        return None if self.op.glue is None else (self.op.glue, [self.src, self.dst])

    def close(self) -> None:
        self.op.close()
