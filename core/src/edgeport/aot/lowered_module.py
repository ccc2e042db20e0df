"""``LoweredBackendModule``: a program (or partition) compiled by one backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.aot.delegate_op import register_lowered_module
from edgeport.backend import CompileSpec
from edgeport.named_data import NamedDataStoreOutput


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[Any, ...]
    dtype: torch.dtype


class LoweredBackendModule(torch.nn.Module):
    """The result of lowering an edge program to one backend (ExecuTorch's ``LoweredBackendModule``).

    Calling it runs ``torch.ops.edgeport.call_delegate``, so it can be used inside another module that is then
    exported again; eagerly that op executes the original program. ``buffer()`` writes a standalone ``.pte`` whose
    single method calls this delegate.
    """

    def __init__(
        self,
        edge_program: ExportedProgram,
        backend_id: str,
        processed_bytes: bytes,
        compile_specs: Sequence[CompileSpec],
        debug_handle_map: dict[Any, Any] | None = None,
        named_data_store_output: NamedDataStoreOutput | None = None,
        constant_inputs: Sequence[torch.Tensor] = (),
    ) -> None:
        super().__init__()
        self._constant_inputs = tuple(constant_inputs)
        self._original_module = edge_program
        self._backend_id = backend_id
        self._processed_bytes = bytes(processed_bytes)
        self._compile_specs = list(compile_specs)
        self.meta: dict[str, Any] = {"debug_handle_map": debug_handle_map}
        self._named_data_store_output = named_data_store_output
        self._key = register_lowered_module(self)

    @property
    def backend_id(self) -> str:
        return self._backend_id

    @property
    def processed_bytes(self) -> bytes:
        return self._processed_bytes

    @property
    def named_data_store_output(self) -> NamedDataStoreOutput | None:
        """The named data (weights) ``preprocess`` handed to the writer, stored in ``Program.named_data``."""
        return self._named_data_store_output

    @property
    def constant_inputs(self) -> tuple[torch.Tensor, ...]:
        """Constant tensors every call passes after the program's inputs (``PreprocessResult.constant_inputs``)."""
        return self._constant_inputs

    @property
    def compile_specs(self) -> list[CompileSpec]:
        return list(self._compile_specs)

    @property
    def original_module(self) -> ExportedProgram:
        return self._original_module

    @property
    def delegate_key(self) -> str:
        """The key that ``call_delegate`` nodes use to refer to this module."""
        return self._key

    def output_metas(self) -> list[TensorMeta]:
        """The delegate call's outputs: the program's user outputs (a buffer's new value that the delegate keeps as
        its own state, ``take_over_mutable_buffer``, is not one)."""
        out_node = self._original_module.graph.output_node()
        kinds = [s.kind.name for s in self._original_module.graph_signature.output_specs]
        metas = []
        for k, arg in enumerate(out_node.args[0]):
            if k < len(kinds) and kinds[k] == "BUFFER_MUTATION":
                continue
            val = arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg
            metas.append(TensorMeta(tuple(val.shape), val.dtype))
        return metas

    def user_input_count(self) -> int:
        return len(self._original_module.graph_signature.user_inputs)

    def forward(self, *args: torch.Tensor) -> Any:
        outputs = torch.ops.edgeport.call_delegate(self._key, [*args, *self._constant_inputs])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __deepcopy__(self, memo: dict[int, Any]) -> LoweredBackendModule:
        # Immutable once built: copies of a graph share it, so its registry key stays valid.
        return self

    def program(self) -> ExportedProgram:
        """An exported program whose only computation is a call to this delegate."""
        from edgeport.aot.to_backend import program_calling_delegate

        return program_calling_delegate(self)

    def buffer(
        self,
        extract_delegate_segments: bool = True,
        segment_alignment: int = 128,
        constant_tensor_alignment: int | None = None,
        delegate_alignment: int | None = None,
        memory_planning: Any = None,
    ) -> bytes:
        """Serialize a standalone program that runs this delegate on its inputs."""
        from edgeport.aot.config import ExecutorchBackendConfig
        from edgeport.aot.executorch_manager import ExecutorchProgramManager

        config = ExecutorchBackendConfig(
            extract_delegate_segments=extract_delegate_segments,
            segment_alignment=segment_alignment,
            constant_tensor_alignment=constant_tensor_alignment,
            delegate_alignment=delegate_alignment,
            memory_planning_pass=memory_planning,
        )
        return ExecutorchProgramManager.from_edge_programs({"forward": self.program()}, {}, config).buffer

    def extra_repr(self) -> str:
        return f"backend_id={self._backend_id!r}, processed_bytes={len(self._processed_bytes)} bytes"
