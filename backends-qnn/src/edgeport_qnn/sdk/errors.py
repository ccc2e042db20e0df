"""QNN error codes (our own table of the public codes) and the exception edgeport raises for them."""

from __future__ import annotations

from collections.abc import Sequence

_COMMON = {1000: "COMMON_ERROR_NOT_SUPPORTED", 1002: "COMMON_ERROR_MEM_ALLOC", 1003: "COMMON_ERROR_SYSTEM",
           1004: "COMMON_ERROR_INVALID_ARGUMENT", 1005: "COMMON_ERROR_OPERATION_NOT_PERMITTED",
           1006: "COMMON_ERROR_PLATFORM_NOT_SUPPORTED", 1007: "COMMON_ERROR_SYSTEM_COMMUNICATION",
           1008: "COMMON_ERROR_INCOMPATIBLE_BINARIES", 1009: "COMMON_ERROR_LOADING_BINARIES",
           1010: "COMMON_ERROR_RESOURCE_UNAVAILABLE", 1100: "COMMON_ERROR_GENERAL"}
_BACKEND = ["CANNOT_INITIALIZE", "ALREADY_INITIALIZED", "TERMINATE_FAILED", "NOT_SUPPORTED", "INVALID_ARGUMENT",
            "OP_PACKAGE_NOT_FOUND", "OP_PACKAGE_IF_PROVIDER_NOT_FOUND", "OP_PACKAGE_REGISTRATION_FAILED",
            "OP_PACKAGE_UNSUPPORTED_VERSION", "OP_PACKAGE_DUPLICATE", "INCONSISTENT_CONFIG", "INVALID_HANDLE",
            "INVALID_CONFIG"]
_CONTEXT = ["INVALID_ARGUMENT", "CTX_DOES_NOT_EXIST", "INVALID_HANDLE", "NOT_FINALIZED", "BINARY_VERSION",
            "CREATE_FROM_BINARY", "GET_BINARY_SIZE_FAILED", "GET_BINARY_FAILED", "BINARY_CONFIGURATION",
            "SET_PROFILE", "INVALID_CONFIG", "BINARY_SUBOPTIMAL", "ABORTED", "TIMED_OUT"]
_GRAPH = {0: "INVALID_ARGUMENT", 1: "INVALID_HANDLE", 2: "GRAPH_DOES_NOT_EXIST", 3: "INVALID_NAME",
          4: "INVALID_TENSOR", 5: "INVALID_OP_CONFIG", 6: "SET_PROFILE", 7: "UNCONNECTED_NODE",
          20: "CREATE_FAILED", 21: "OPTIMIZATION_FAILED", 22: "FINALIZE_FAILED", 23: "GRAPH_NOT_FINALIZED",
          24: "GRAPH_FINALIZED", 25: "EXECUTION_ASYNC_FIFO_FULL", 26: "SIGNAL_IN_USE", 27: "ABORTED",
          28: "PROFILE_IN_USE", 29: "TIMED_OUT", 30: "SUBGRAPH", 31: "DISABLED", 32: "DYNAMIC_TENSOR_SHAPE",
          33: "TENSOR_SPARSITY", 34: "EARLY_TERMINATION", 35: "INVALID_CONTEXT"}
_TENSOR = {1: "INVALID_HANDLE", 2: "DOES_NOT_EXIST", 3: "ALREADY_EXISTS", 4: "INVALID_TENSOR_PARAM",
           5: "UNSUPPORTED_TENSOR_PARAM", 6: "NAME_HASH_COLLISION"}
_SYSTEM_CONTEXT = {0: "INVALID_HANDLE", 1: "INVALID_ARGUMENT", 2: "OPERATION_FAILED", 10: "MALFORMED_BINARY"}

ERROR_NAMES: dict[int, str] = {0: "SUCCESS", **{code: f"QNN_{name}" for code, name in _COMMON.items()}}
ERROR_NAMES.update({4000 + i: f"QNN_BACKEND_ERROR_{name}" for i, name in enumerate(_BACKEND)})
ERROR_NAMES.update({5000 + i: f"QNN_CONTEXT_ERROR_{name}" for i, name in enumerate(_CONTEXT)})
ERROR_NAMES.update({6000 + i: f"QNN_GRAPH_ERROR_{name}" for i, name in _GRAPH.items()})
ERROR_NAMES.update({7000 + i: f"QNN_TENSOR_ERROR_{name}" for i, name in _TENSOR.items()})
ERROR_NAMES.update({30000 + i: f"QNN_SYSTEM_CONTEXT_ERROR_{name}" for i, name in _SYSTEM_CONTEXT.items()})


def error_name(code: int) -> str:
    """The symbolic name of a QNN error code (``QNN_ERROR_<code>`` when not in our table)."""
    return ERROR_NAMES.get(code, f"QNN_ERROR_{code}")


class QnnError(RuntimeError):
    """A QNN call failed, or a request could not be handed to QNN safely.

    ``code`` is the 16-bit QNN error code (``None`` when edgeport refused the request before calling QNN);
    ``name`` its symbolic name; ``op`` the QNN op type concerned (for node errors); ``library_log`` what the QNN
    library logged at error level during the failing call.
    """

    def __init__(self, what: str, code: int | None = None, *, op: str | None = None,
                 detail: str | None = None, library_log: Sequence[str] = ()) -> None:
        self.what = what
        self.code = code
        self.name = error_name(code) if code is not None else None
        self.op = op
        self.detail = detail
        self.library_log = tuple(library_log)
        parts = [what]
        if op is not None:
            parts.append(f"op {op!r}")
        if code is not None:
            parts.append(f"QNN error {code} ({self.name})")
        message = ": ".join(parts[:1]) + (" [" + "; ".join(parts[1:]) + "]" if len(parts) > 1 else "")
        if detail:
            message += f": {detail}"
        if self.library_log:
            message += "\nQNN log:\n  " + "\n  ".join(self.library_log[-8:])
        super().__init__(message)
