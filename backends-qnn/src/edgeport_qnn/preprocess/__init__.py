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


#: finalized graphs by (recipe digest, SoC): the partitioner's test compilation of a partition makes its
#: ``preprocess`` free (bounded: the oldest entries go first)
_FINALIZED: dict[tuple[str, int | None], Any] = {}
_FINALIZED_MAX = 32


def _remember(key: tuple[str, int | None], done: Any) -> None:
    _FINALIZED[key] = done
    while len(_FINALIZED) > _FINALIZED_MAX:
        del _FINALIZED[next(iter(_FINALIZED))]


def _origin_in_log(recipe: Any, exc: Exception) -> str:
    """The torch node whose QNN node the library's log names (finalize errors name QNN nodes, e.g.
    ``"elementwisemultiply_6" generated: could not create op``), or ``""``."""
    text = str(exc) + "\n" + "\n".join(getattr(exc, "library_log", ()))
    for qnn_node, origin in recipe.origins.items():
        if f'"{qnn_node}"' in text or f"'{qnn_node}'" in text:
            return origin
    return ""


def lower_to_qnn(edge_program: ExportedProgram, soc_model: int | None = None,
                 use_fp16: bool = False) -> tuple[Any, dict[str, Any]]:
    """Build the partition's QNN graph (recorded here, see :mod:`edgeport_qnn.isolated`), then validate, finalize
    and serialize it in the worker of its HTP configuration (the device of ``soc_model``, ``None``: the default
    device; ``use_fp16``: HTP fp16 graph precision); returns (``Finalized``, summary)."""
    from edgeport.aot.capability_partitioner import op_name
    from edgeport_qnn.isolated import RecordingBuilder, recipe_digest, run_recipe
    from edgeport_qnn.sdk import QnnError

    builder = RecordingBuilder(GRAPH_NAME, fp16=use_fp16)
    lowering = Lowering(builder, LOWERINGS)
    lowering.quant_lowerings = QUANTIZED_LOWERINGS
    inputs: list[dict[str, Any]] = []
    graph = edge_program.graph
    for node in graph.nodes:
        builder.current = node.name
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
        except ValueError as exc:
            raise LoweringError(f"{node.name} ({node.target}): {exc}") from exc
        except LoweringError as exc:
            raise LoweringError(f"{node.name} ({node.target}): {exc}") from exc
    ops = sorted({op_name(n.target) for n in graph.nodes if n.op == "call_function"})
    what = f"the partition's graph (torch ops: {', '.join(ops)})"
    key = (recipe_digest(builder.recipe), soc_model)
    done = _FINALIZED.get(key)
    if done is None:
        try:
            done = run_recipe(builder.recipe, soc_model, want_binary=True, what=what)
        except QnnError as exc:
            origin = builder.recipe.origins.get(getattr(exc, "qnn_node", ""), "") or _origin_in_log(builder.recipe, exc)
            if origin:
                raise LoweringError(f"{origin}: the QNN backend refused its lowering: {exc}") from None
            raise LoweringError(f"QNN could not finalize the partition's graph: {exc}") from None
        _remember(key, done)
    outputs = [{"shape": list(s), "dtype": "float32"} for s in done.outputs]
    return done, {"ops": dict(sorted(lowering.op_counts.items())), "inputs": inputs, "outputs": outputs}


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    from edgeport_qnn import __version__
    from edgeport_qnn.blob import BlobHeader, pack_blob
    from edgeport_qnn.isolated import in_process
    from edgeport_qnn.options import QnnCompileOptions

    options = QnnCompileOptions.from_compile_specs(compile_specs)
    soc = on_soc_device(edge_program.graph, options.use_fp16)
    if in_process() and not soc:
        from edgeport_qnn.runtime import shared_backend

        if shared_backend().soc_configured:
            raise LoweringError(
                "QnnBackend: this process has already configured the HTP for a SoC (it lowered or loaded a quantized "
                "or fp16 QnnBackend program) and EDGEPORT_QNN_IN_PROCESS=1 keeps lowering in this process; Qualcomm's "
                "HTP emulator then prepares every later float32 graph of the process at fp16 precision. Unset "
                "EDGEPORT_QNN_IN_PROCESS (graphs are then finalized in one worker process per HTP configuration)")
    done, summary = lower_to_qnn(edge_program, int(options.chipset) if soc else None, options.use_fp16)
    core, backend_api = done.api_version
    header = BlobHeader(plugin_version=__version__, qnn_core_api=core, qnn_backend_api=backend_api,
                        qnn_build=done.build_id, soc_model=options.soc_model, graph=GRAPH_NAME,
                        inputs=summary["inputs"], outputs=summary["outputs"], ops=summary["ops"],
                        device="soc" if soc else "default", precision="fp16" if options.use_fp16 else "fp32")
    return PreprocessResult(processed_bytes=pack_blob(header, done.binary))
