"""Our ctypes declarations of QNN's two function tables: the backend interface (``QnnInterface_getProviders``)
and the system interface (``QnnSystemInterface_getProviders``), with typed prototypes for what edgeport calls,
plus the context-binary description the system library returns.

A provider struct lives in the library's memory; we only read it through a pointer, so declaring a prefix of a
table (later QNN releases append entries) is safe.
"""

from __future__ import annotations

import ctypes as C

from edgeport_qnn.sdk.abi import ApiVersion, ContextBinarySize, ErrorHandle, Handle, OpConfig, Tensor, Version

P = C.POINTER
_E = ErrorHandle
_H = Handle

#: The backend function table, entry names in ABI order.
BACKEND_TABLE_ORDER: tuple[str, ...] = (
    "propertyHasCapability",
    "backendCreate", "backendSetConfig", "backendGetApiVersion", "backendGetBuildId", "backendRegisterOpPackage",
    "backendGetSupportedOperations", "backendValidateOpConfig", "backendFree",
    "contextCreate", "contextSetConfig", "contextGetBinarySize", "contextGetBinary", "contextCreateFromBinary",
    "contextFree",
    "graphCreate", "graphCreateSubgraph", "graphSetConfig", "graphAddNode", "graphFinalize", "graphRetrieve",
    "graphExecute", "graphExecuteAsync",
    "tensorCreateContextTensor", "tensorCreateGraphTensor",
    "logCreate", "logSetLogLevel", "logFree",
    "profileCreate", "profileSetConfig", "profileGetEvents", "profileGetSubEvents", "profileGetEventData",
    "profileGetExtendedEventData", "profileFree",
    "memRegister", "memDeRegister",
    "deviceGetPlatformInfo", "deviceFreePlatformInfo", "deviceGetInfrastructure", "deviceCreate", "deviceSetConfig",
    "deviceGetInfo", "deviceFree",
    "signalCreate", "signalSetConfig", "signalTrigger", "signalFree",
    "errorGetMessage", "errorGetVerboseMessage", "errorFreeVerboseMessage",
    "graphPrepareExecutionEnvironment", "graphReleaseExecutionEnvironment", "graphGetProperty",
    "contextValidateBinary", "contextCreateFromBinaryWithSignal",
)


class BackendTable(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in BACKEND_TABLE_ORDER]


class BackendProvider(C.Structure):
    _fields_ = [("backend_id", C.c_uint32), ("provider_name", C.c_char_p), ("api_version", ApiVersion),
                ("table", BackendTable)]


#: void callback(const char* fmt, level, uint64 timestamp, va_list args); va_list is a pointer on x86-64.
LogCallback = C.CFUNCTYPE(None, C.c_char_p, C.c_uint32, C.c_uint64, C.c_void_p)

#: Typed prototypes of the backend entries edgeport calls (the configs are NULL-terminated pointer arrays).
BACKEND_PROTOTYPES: dict[str, type] = {
    "backendCreate": C.CFUNCTYPE(_E, _H, P(C.c_void_p), P(_H)),
    "backendGetApiVersion": C.CFUNCTYPE(_E, P(ApiVersion)),
    "backendGetBuildId": C.CFUNCTYPE(_E, P(C.c_char_p)),
    "backendValidateOpConfig": C.CFUNCTYPE(_E, _H, OpConfig),
    "backendFree": C.CFUNCTYPE(_E, _H),
    "deviceCreate": C.CFUNCTYPE(_E, _H, P(C.c_void_p), P(_H)),
    "deviceFree": C.CFUNCTYPE(_E, _H),
    "contextCreate": C.CFUNCTYPE(_E, _H, _H, P(C.c_void_p), P(_H)),
    "contextGetBinarySize": C.CFUNCTYPE(_E, _H, P(ContextBinarySize)),
    "contextGetBinary": C.CFUNCTYPE(_E, _H, C.c_void_p, ContextBinarySize, P(ContextBinarySize)),
    "contextCreateFromBinary": C.CFUNCTYPE(_E, _H, _H, P(C.c_void_p), C.c_void_p, ContextBinarySize, P(_H), _H),
    "contextFree": C.CFUNCTYPE(_E, _H, _H),
    "graphCreate": C.CFUNCTYPE(_E, _H, C.c_char_p, P(C.c_void_p), P(_H)),
    "graphAddNode": C.CFUNCTYPE(_E, _H, OpConfig),
    "graphFinalize": C.CFUNCTYPE(_E, _H, _H, _H),
    "graphRetrieve": C.CFUNCTYPE(_E, _H, C.c_char_p, P(_H)),
    "graphExecute": C.CFUNCTYPE(_E, _H, P(Tensor), C.c_uint32, P(Tensor), C.c_uint32, _H, _H),
    "tensorCreateGraphTensor": C.CFUNCTYPE(_E, _H, P(Tensor)),
    "logCreate": C.CFUNCTYPE(_E, LogCallback, C.c_uint32, P(_H)),
    "logFree": C.CFUNCTYPE(_E, _H),
    "errorGetMessage": C.CFUNCTYPE(_E, _E, P(C.c_char_p)),
}

GetBackendProviders = C.CFUNCTYPE(_E, P(P(P(BackendProvider))), P(C.c_uint32))


# ----------------------------------------------------------------------------------------------- system library
class SystemTable(C.Structure):
    _fields_ = [("systemContextCreate", C.c_void_p), ("systemContextGetBinaryInfo", C.c_void_p),
                ("systemContextGetMetaData", C.c_void_p), ("systemContextFree", C.c_void_p)]


class SystemProvider(C.Structure):
    _fields_ = [("backend_id", C.c_uint32), ("provider_name", C.c_char_p), ("api_version", Version),
                ("table", SystemTable)]


class GraphInfoV1(C.Structure):
    _fields_ = [("graph_name", C.c_char_p), ("num_inputs", C.c_uint32), ("inputs", P(Tensor)),
                ("num_outputs", C.c_uint32), ("outputs", P(Tensor))]


class GraphInfoV3(C.Structure):
    """Versions 2 and 3 extend version 1 at the end; only the size matters to us (array stride)."""

    _fields_ = GraphInfoV1._fields_ + [("num_updateable", C.c_uint32), ("updateable", P(Tensor)),
                                       ("blob_info_size", C.c_uint32), ("blob_info", C.c_void_p),
                                       ("start_op_index", C.c_uint32), ("end_op_index", C.c_uint32)]


class _GraphInfoUnion(C.Union):
    _fields_ = [("v1", GraphInfoV1), ("_v3", GraphInfoV3)]


class GraphInfo(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _GraphInfoUnion)]


_BINARY_INFO_HEAD = [("backend_id", C.c_uint32), ("build_id", C.c_char_p), ("core_api_version", Version),
                     ("backend_api_version", Version), ("soc_version", C.c_char_p)]
_BINARY_INFO_GRAPHS = [("num_context_tensors", C.c_uint32), ("context_tensors", P(Tensor)),
                       ("num_graphs", C.c_uint32), ("graphs", P(GraphInfo))]


class BinaryInfoV1(C.Structure):
    """Versions 1 and 2 (2 appends a platform-info pointer)."""

    _fields_ = _BINARY_INFO_HEAD + [("hw_info_blob_version", Version), ("context_blob_version", Version),
                                    ("hw_info_blob_size", C.c_uint32), ("hw_info_blob", C.c_void_p),
                                    ("context_blob_size", C.c_uint64)] + _BINARY_INFO_GRAPHS


class BinaryInfoV3(C.Structure):
    _fields_ = _BINARY_INFO_HEAD + [("context_blob_version", Version), ("context_blob_size", C.c_uint64)] + \
        _BINARY_INFO_GRAPHS


class _BinaryInfoUnion(C.Union):
    _fields_ = [("v1", BinaryInfoV1), ("v3", BinaryInfoV3)]


class BinaryInfo(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _BinaryInfoUnion)]


SYSTEM_PROTOTYPES: dict[str, type] = {
    "systemContextCreate": C.CFUNCTYPE(_E, P(_H)),
    "systemContextGetBinaryInfo": C.CFUNCTYPE(_E, _H, C.c_void_p, C.c_uint64, P(P(BinaryInfo)), P(ContextBinarySize)),
    "systemContextFree": C.CFUNCTYPE(_E, _H),
}

GetSystemProviders = C.CFUNCTYPE(_E, P(P(P(SystemProvider))), P(C.c_uint32))


def bind(table: C.Structure, prototypes: dict[str, type], name: str):
    """The typed callable of table entry ``name`` (``None`` when the library leaves it NULL)."""
    address = getattr(table, name)
    if not address:
        return None
    return prototypes[name](address)
