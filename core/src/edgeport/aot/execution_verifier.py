"""Verifier class for execution-dialect programs (out variants and ``alloc`` markers)."""

from __future__ import annotations

import types
from typing import Any

from torch._export.verifier import Verifier
from torch._ops import HigherOrderOperator, OpOverload


class ExecutionDialectVerifier(Verifier):
    """Accepts the ``alloc`` marker functions that torch's ATen verifier would reject."""

    dialect = "EDGEPORT_EXECUTION"

    def allowed_op_types(self) -> tuple[type[Any], ...]:
        return (OpOverload, HigherOrderOperator, types.FunctionType)
