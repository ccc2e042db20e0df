"""``preprocess`` of ``QnnBackend``: one edge sub-program -> a QNN HTP graph, finalized, serialized as a QNN
context binary inside edgeport's versioned blob (:mod:`edgeport_qnn.blob`).

The per-op lowerings are in :mod:`edgeport_qnn.preprocess.ops` (one op family per file), driven by
:class:`~edgeport_qnn.preprocess.lowering.Lowering` on the SDK's :class:`~edgeport_qnn.sdk.GraphBuilder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from edgeport.aot.graph_utils import placeholder_tensor
from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Const, Lowering, static_shape
from edgeport_qnn.preprocess.ops import LOWERINGS, QUANTIZED_LOWERINGS

__all__ = ["LOWERINGS", "lower_to_qnn", "preprocess"]

GRAPH_NAME = "forward"


def on_soc_device(graph: Any, use_fp16: bool) -> bool:
    """Whether a graph is built on the SoC-configured device: quantized or fp16 graphs are (the SoC sets the HTP
    architecture: 16-bit weights need v73+); float32 graphs stay on the default device, where the emulator
    computes them in fp32 (on a SoC-configured device it runs float tensors in fp16 whatever the graph precision
    config says: 4.4e-4 relative error on a 64-wide FullyConnected instead of 2.7e-7)."""
    from edgeport.aot.capability_partitioner import op_name
    from edgeport_qnn.preprocess.ops.quant import QUANTIZE

    return use_fp16 or any(n.op == "call_function" and op_name(n.target) == QUANTIZE for n in graph.nodes)


def lower_to_qnn(edge_program: ExportedProgram, backend: Any, soc_model: int | None = None,
                 use_fp16: bool = False) -> tuple[Any, dict[str, Any]]:
    """Build and finalize the partition's QNN graph in a new context of ``backend`` (on the device of
    ``soc_model``, ``None``: the default device; ``use_fp16``: HTP fp16 graph precision); returns (context,
    summary)."""
    from edgeport_qnn.sdk import QnnError

    context = backend.create_context(soc_model)
    try:
        builder = context.graph_builder(GRAPH_NAME, fp16=use_fp16)
        lowering = Lowering(builder, LOWERINGS)
        lowering.quant_lowerings = QUANTIZED_LOWERINGS
        inputs: list[dict[str, Any]] = []
        graph = edge_program.graph
        for node in graph.nodes:
            try:
                if node.op == "placeholder":
                    tensor = placeholder_tensor(edge_program, node)
                    if tensor is not None:
                        lowering.values[node] = Const(tensor.detach().contiguous().numpy().copy())
                        continue
                    dtype = str(node.meta["val"].dtype).removeprefix("torch.")
                    if dtype != "float32":
                        raise LoweringError(f"input {node.name} is {dtype}; QnnBackend takes float32 inputs")
                    shape = static_shape(node)
                    lowering.values[node] = lowering.input(shape, f"input_{len(inputs)}")
                    inputs.append({"shape": list(shape), "dtype": "float32"})
                elif node.op == "call_function":
                    lowering.lower(node)
                elif node.op == "output":
                    for i, out in enumerate(node.args[0]):
                        lowering.output(out, i)
            except QnnError as exc:
                raise LoweringError(f"{node.name}: the QNN backend refused its lowering: {exc}") from exc
            except LoweringError as exc:
                raise LoweringError(f"{node.name} ({node.target}): {exc}") from exc
        try:
            graph_obj = builder.finalize()
        except QnnError as exc:
            raise LoweringError(f"QNN could not finalize the partition's graph: {exc}") from exc
        outputs = [{"shape": list(s.shape), "dtype": "float32"} for s in graph_obj.outputs]
        return context, {"ops": dict(sorted(lowering.op_counts.items())), "inputs": inputs, "outputs": outputs}
    except BaseException:
        context.close()
        raise


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    from edgeport_qnn import __version__
    from edgeport_qnn.blob import BlobHeader, pack_blob
    from edgeport_qnn.options import QnnCompileOptions
    from edgeport_qnn.runtime import shared_backend

    options = QnnCompileOptions.from_compile_specs(compile_specs)
    backend = shared_backend()
    soc = on_soc_device(edge_program.graph, options.use_fp16)
    if not soc and backend.soc_configured:
        raise LoweringError(
            "QnnBackend: this process has already configured the HTP for a SoC (it lowered or loaded a quantized or "
            "fp16 QnnBackend program); Qualcomm's HTP emulator then prepares every later float32 graph of the process "
            "at fp16 precision (about 5e-4 relative error instead of 1e-7). Lower float32 models in a process that "
            "has not used quantized/fp16 QnnBackend programs yet (e.g. before them, or in a subprocess), or ask for "
            "fp16 explicitly with generate_htp_compiler_spec(use_fp16=True)")
    context, summary = lower_to_qnn(edge_program, backend, int(options.chipset) if soc else None, options.use_fp16)
    with context:
        binary = context.context_binary()
    core, backend_api = backend.api_version
    header = BlobHeader(plugin_version=__version__, qnn_core_api=core, qnn_backend_api=backend_api,
                        qnn_build=backend.build_id, soc_model=options.soc_model, graph=GRAPH_NAME,
                        inputs=summary["inputs"], outputs=summary["outputs"], ops=summary["ops"],
                        device="soc" if soc else "default", precision="fp16" if options.use_fp16 else "fp32")
    return PreprocessResult(processed_bytes=pack_blob(header, binary))
