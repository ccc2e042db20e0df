"""``ExportPass``: the base class for user transform passes (ExecuTorch's ``ExportPass``).

Override ``call_operator(self, op, args, kwargs, meta)`` and return ``super().call_operator(new_op, args,
kwargs, meta)`` to rewrite ops; the pass re-traces the graph so metadata stays correct. Built on torch's
``_ExportPassBaseDeprecatedDoNotUse`` (private; wrapped here so only this module depends on it).
"""

from __future__ import annotations

from torch._export.pass_base import _ExportPassBaseDeprecatedDoNotUse


class ExportPass(_ExportPassBaseDeprecatedDoNotUse):
    """Base class of a graph-rewriting pass; an instance is callable on a GraphModule and returns a PassResult."""
