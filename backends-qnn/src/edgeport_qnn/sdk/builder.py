"""Building a QNN graph tensor by tensor and node by node (ops of Qualcomm's ``qti.aisw`` package)."""

from __future__ import annotations

import ctypes as C
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeport_qnn.sdk import abi
from edgeport_qnn.sdk.errors import QnnError
from edgeport_qnn.sdk.tensors import (
    Keep,
    QuantParams,
    TensorSpec,
    check_name,
    make_scalar_param,
    make_spec,
    make_tensor,
)

if TYPE_CHECKING:
    from edgeport_qnn.sdk.session import Context, Graph

#: A node output: a name declared with ``add_output``, or an intermediate tensor ``TensorSpec`` /
#: ``(name, shape, dtype)`` / ``(name, shape, dtype, quant)``.
OutputLike = str | TensorSpec | tuple


class GraphBuilder:
    """Builds graph ``name`` in ``context``: declare inputs, outputs and constants, add nodes in topological
    order, then :meth:`finalize`. Each node is validated by the backend (``backendValidateOpConfig``) first."""

    def __init__(self, context: Context, name: str, *, fp16: bool = False, optimization_level: int | None = None,
                 vtcm_mb: int | None = None) -> None:
        self.context = context
        self.name = name
        encoded = check_name(name, "graph")
        if name in context.graphs or any(b.name == name for b in context._builders):
            raise ValueError(f"graph {name!r} already exists in this context")
        backend = context.backend
        self._keep = Keep()
        self._tensors: dict[str, tuple[TensorSpec, abi.Tensor]] = {}
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._available: set[str] = set()  # tensors a node may read
        self._nodes: set[str] = set()
        self._graph: Graph | None = None
        configs = None
        if backend.kind == "htp":
            from edgeport_qnn.sdk.configs import config_list, htp_graph_records

            configs = config_list(htp_graph_records(fp16=fp16, optimization_level=optimization_level,
                                                    vtcm_mb=vtcm_mb, keep=self._keep), self._keep)
        elif fp16 or optimization_level is not None or vtcm_mb is not None:
            raise ValueError(f"graph options fp16/optimization_level/vtcm_mb are HTP options; backend {backend.kind}")
        with backend._lock:
            context._require_open()
            out = C.c_void_p()
            backend.call(backend._table.graphCreate, context.handle, self._keep(encoded), configs, C.byref(out),
                         what=f"graphCreate {name!r}")
            self._handle = out.value
        context._builders.append(self)

    @property
    def finalized(self) -> bool:
        return self._graph is not None

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            raise QnnError(f"graph {self.name!r} is not finalized")
        return self._graph

    # ------------------------------------------------------------------------------------------ tensors
    def _check_open(self) -> None:
        self.context._require_open()
        if self._graph is not None:
            raise QnnError(f"graph {self.name!r} is finalized; it cannot change")

    def _new_spec(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None = None) -> TensorSpec:
        spec = make_spec(name, shape, dtype, quant)
        if name in self._tensors:
            raise ValueError(f"graph {self.name!r} already has a tensor named {name!r}")
        return spec

    def _create(self, spec: TensorSpec, tensor_type: abi.TensorType, data: np.ndarray | None = None) -> abi.Tensor:
        tensor = make_tensor(spec, tensor_type, self._keep, data)
        backend = self.context.backend
        with backend._lock:
            self._check_open()
            backend.call(backend._table.tensorCreateGraphTensor, self._handle, C.byref(tensor),
                         what=f"tensorCreateGraphTensor {spec.name!r}")
        self._tensors[spec.name] = (spec, tensor)
        return tensor

    def add_input(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None = None) -> TensorSpec:
        """Declare graph input ``name`` (inputs are passed to :meth:`Graph.execute` in declaration order)."""
        self._check_open()
        spec = self._new_spec(name, shape, dtype, quant)
        self._create(spec, abi.TensorType.APP_WRITE)
        self._inputs.append(name)
        self._available.add(name)
        return spec

    def add_output(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None = None) -> TensorSpec:
        """Declare graph output ``name``, to be produced by a later node (returned in declaration order)."""
        self._check_open()
        spec = self._new_spec(name, shape, dtype, quant)
        self._create(spec, abi.TensorType.APP_READ)
        self._outputs.append(name)
        return spec

    def add_static(self, name: str, array: np.ndarray, quant: QuantParams | None = None) -> TensorSpec:
        """Add constant ``name`` holding ``array`` (copied; for quantized constants, the raw integer values)."""
        self._check_open()
        if not isinstance(array, np.ndarray):
            raise ValueError(f"static {name!r}: expected a numpy array, got {type(array).__name__}")
        if array.ndim == 0:
            array = array.reshape(1)
        data = np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
        spec = self._new_spec(name, data.shape, data.dtype, quant)
        self._create(spec, abi.TensorType.STATIC, data)
        self._available.add(name)
        return spec

    # ------------------------------------------------------------------------------------------ nodes
    def _output_spec(self, item: OutputLike) -> tuple[TensorSpec, bool]:
        if isinstance(item, str):
            if item not in self._outputs:
                raise ValueError(f"node output {item!r} is not a declared graph output; declare it with "
                                 "add_output, or pass (name, shape, dtype[, quant]) for an intermediate tensor")
            if item in self._available:
                raise ValueError(f"graph output {item!r} is already produced by another node")
            return self._tensors[item][0], True
        if isinstance(item, TensorSpec):
            return self._new_spec(item.name, item.shape, item.dtype, item.quant), False
        if isinstance(item, tuple) and len(item) in (3, 4):
            return self._new_spec(*item), False
        raise ValueError(f"bad node output {item!r}: expected a name, a TensorSpec or (name, shape, dtype[, quant])")

    def add_node(self, op_type: str, name: str, inputs: Sequence[str], outputs: Sequence[OutputLike],
                 params: Mapping[str, Any] | None = None, *, package: str = "qti.aisw") -> None:
        """Add node ``name`` of QNN op ``op_type`` (e.g. ``"Conv2d"``) reading ``inputs`` (tensor names) and
        producing ``outputs``. ``params``: name -> bool/int/float/numpy scalar (scalar parameter) or numpy array
        (tensor parameter, e.g. ``stride``). Raises :class:`QnnError` (with the op, the QNN error code and its
        name) when the backend rejects the node, ``ValueError`` for malformed requests."""
        self._check_open()
        op_bytes = check_name(op_type, "op type")
        name_bytes = check_name(name, "node")
        package_bytes = check_name(package, "op package")
        if name in self._nodes:
            raise ValueError(f"graph {self.name!r} already has a node named {name!r}")
        if isinstance(inputs, str) or isinstance(outputs, str):
            raise ValueError("inputs and outputs must be sequences of names, not a single str")
        for tensor in inputs:
            if not isinstance(tensor, str) or tensor not in self._tensors:
                raise ValueError(f"node {name!r}: unknown input tensor {tensor!r}")
            if tensor not in self._available:
                raise ValueError(f"node {name!r}: input {tensor!r} is not produced yet (add nodes in topological "
                                 "order)")
        if not outputs:
            raise ValueError(f"node {name!r}: at least one output is required")
        out_specs = [self._output_spec(item) for item in outputs]
        if len({spec.name for spec, _ in out_specs}) != len(out_specs):
            raise ValueError(f"node {name!r}: duplicate output names")
        keep = self._keep  # everything QNN is handed stays alive with the graph
        scalar_params: list[abi.Param] = []
        tensor_params: list[tuple[str, TensorSpec, np.ndarray]] = []
        for pname, value in (params or {}).items():
            check_name(pname, "parameter")
            if isinstance(value, np.ndarray):
                data = np.ascontiguousarray(value.reshape(1) if value.ndim == 0 else value)
                pspec = make_spec(f"{name}.{pname}", data.shape, data.dtype, None)
                if pspec.name in self._tensors:
                    raise ValueError(f"tensor {pspec.name!r} already exists")
                tensor_params.append((pname, pspec, data))
            else:
                scalar_params.append(make_scalar_param(pname, value, keep))

        def op_config(created: bool) -> abi.OpConfig:
            ins = (abi.Tensor * max(len(inputs), 1))(*[self._tensors[t][1] for t in inputs])
            outs = (abi.Tensor * len(out_specs))()
            for i, (spec, declared) in enumerate(out_specs):
                if declared or created:
                    outs[i] = self._tensors[spec.name][1]
                else:
                    outs[i] = make_tensor(spec, abi.TensorType.NATIVE, keep)
            plist = (abi.Param * max(len(scalar_params) + len(tensor_params), 1))(*scalar_params)
            for i, (pname, pspec, data) in enumerate(tensor_params, start=len(scalar_params)):
                plist[i].param_type = abi.ParamType.TENSOR
                plist[i].name = keep(pname.encode())
                plist[i].tensor = (self._tensors[pspec.name][1] if created
                                   else make_tensor(pspec, abi.TensorType.STATIC, keep, data))
            config = abi.OpConfig()
            config.version = abi.OPCONFIG_VERSION_1
            v1 = config.v1
            v1.name, v1.package_name, v1.type_name = keep(name_bytes), keep(package_bytes), keep(op_bytes)
            v1.num_params = len(scalar_params) + len(tensor_params)
            v1.params = C.cast(keep(plist), C.POINTER(abi.Param))
            v1.num_inputs = len(inputs)
            v1.inputs = C.cast(keep(ins), C.POINTER(abi.Tensor))
            v1.num_outputs = len(out_specs)
            v1.outputs = C.cast(keep(outs), C.POINTER(abi.Tensor))
            return config

        backend = self.context.backend
        with backend._lock:
            self._check_open()
            # backend-level validation follows the architecture of the device created last; for a context on another
            # device only graphAddNode (which validates for the context's device) is meaningful
            if self.context.soc_model == backend.last_device_soc:
                backend.call(backend._table.backendValidateOpConfig, backend._h.backend, op_config(False),
                             what=f"backendValidateOpConfig of node {name!r}", op=op_type)
            for _, pspec, data in tensor_params:
                self._create(pspec, abi.TensorType.STATIC, data)
            for spec, declared in out_specs:
                if not declared:
                    self._create(spec, abi.TensorType.NATIVE)
            backend.call(backend._table.graphAddNode, self._handle, op_config(True),
                         what=f"graphAddNode {name!r}", op=op_type)
            self._nodes.add(name)
        self._available.update(spec.name for spec, _ in out_specs)

    # ------------------------------------------------------------------------------------------ finish
    def finalize(self) -> Graph:
        """Finalize (compile) the graph; returns the runnable :class:`Graph` (also ``context.graphs[name]``)."""
        from edgeport_qnn.sdk.session import Graph

        self._check_open()
        missing = [o for o in self._outputs if o not in self._available]
        if not self._outputs or missing:
            raise QnnError(f"graph {self.name!r}: " + (f"outputs {missing} are not produced by any node"
                                                      if missing else "no graph output declared"))
        if not self._inputs:
            raise QnnError(f"graph {self.name!r}: no graph input declared")
        backend = self.context.backend
        with backend._lock:
            self._check_open()
            backend.call(backend._table.graphFinalize, self._handle, None, None, what=f"graphFinalize {self.name!r}")
            graph = Graph(self.context, self.name, self._handle,
                          [(self._tensors[n][0], self._tensors[n][1].v1.id) for n in self._inputs],
                          [(self._tensors[n][0], self._tensors[n][1].v1.id) for n in self._outputs])
            graph._keep(self._keep)  # static data stays alive as long as the graph
            self._graph = graph
            self.context.graphs[self.name] = graph
        return graph

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the finalized graph (see :meth:`Graph.execute`)."""
        return self.graph.execute(inputs)

    def context_binary(self) -> bytes:
        """The context binary of this graph's context (see :meth:`Context.context_binary`)."""
        return self.context.context_binary()
