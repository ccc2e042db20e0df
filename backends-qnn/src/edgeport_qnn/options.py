"""Compile options of ``QnnBackend`` (torch-free), with ExecuTorch's names.

``generate_qnn_executorch_compiler_spec(soc_model=QcomChipset.SM8650, backend_options=
generate_htp_compiler_spec(use_fp16=False))`` returns the ``CompileSpec`` list a :class:`QnnPartitioner`
takes, as in ExecuTorch's ``executorch.backends.qualcomm.utils.utils``. The values are edgeport's own encoding
(one JSON-encoded spec per field of :class:`QnnCompileOptions`), not ExecuTorch's QNN flatbuffer options.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from edgeport.backend import CompileOptions, CompileSpec, RuntimeOptions

QNN_BACKEND_ID = "QnnBackend"


class QcomChipset(enum.IntEnum):
    """Qualcomm SoC ids (the values of ExecuTorch's ``QcomChipset``; QNN's ``socModel``).

    Quantized and fp16 graphs are built on an HTP device configured with this SoC (its HTP architecture, e.g.
    SM8650: v75); float32 graphs on the backend's default device (see ``docs/backends/qnn.md``). The SoC is
    recorded in the blob and the executor refuses a blob lowered for another SoC than the one it runs for
    (``QnnRuntimeOptions.soc_model``, by default :data:`DEFAULT_CHIPSET`).
    """

    SM8450 = 36
    SM8475 = 42
    SM8550 = 43
    SM8650 = 57
    SM8750 = 69


DEFAULT_CHIPSET = QcomChipset.SM8650


@dataclass(frozen=True)
class HtpBackendOptions:
    """What ``generate_htp_compiler_spec`` returns: HTP options (precision, performance mode)."""

    use_fp16: bool = False
    use_multi_contexts: bool = False
    use_weight_sharing: bool = False


def generate_htp_compiler_spec(use_fp16: bool = False, use_dlbc: bool = False, use_multi_contexts: bool = False,
                               use_weight_sharing: bool = False) -> HtpBackendOptions:
    """HTP backend options (ExecuTorch's signature). ``use_fp16=True`` asks the HTP to run float graphs in fp16
    precision (fp32 I/O); ``use_dlbc``, multi contexts and weight sharing are accepted and must stay False."""
    for name, value in (("use_dlbc", use_dlbc), ("use_multi_contexts", use_multi_contexts),
                        ("use_weight_sharing", use_weight_sharing)):
        if value:
            raise ValueError(f"generate_htp_compiler_spec: {name}=True is not supported by edgeport-qnn yet")
    return HtpBackendOptions(use_fp16=bool(use_fp16))


@dataclass
class QnnCompileOptions(CompileOptions):
    """``QnnBackend``'s options. ``soc_model``: a :class:`QcomChipset` name (``"SM8650"``); ``use_fp16``: build
    float graphs with HTP fp16 graph precision on the SoC's device (``False``: fp32 on the default device)."""

    soc_model: str = DEFAULT_CHIPSET.name
    use_fp16: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.soc_model, QcomChipset):
            self.soc_model = self.soc_model.name
        if self.soc_model not in QcomChipset.__members__:
            raise ValueError(f"unknown soc_model {self.soc_model!r}; one of {list(QcomChipset.__members__)}")
        if not isinstance(self.use_fp16, bool):
            raise ValueError(f"QnnCompileOptions.use_fp16 must be a bool, got {self.use_fp16!r}")

    @property
    def chipset(self) -> QcomChipset:
        return QcomChipset[self.soc_model]

    def to_compile_specs(self) -> list[CompileSpec]:
        return [CompileSpec("soc_model", json.dumps(self.soc_model).encode()),
                CompileSpec("use_fp16", json.dumps(self.use_fp16).encode())]

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> QnnCompileOptions:
        known = ("soc_model", "use_fp16")
        values = {}
        for spec in specs:
            if spec.key not in known:
                raise ValueError(f"unknown compile spec {spec.key!r} for QnnBackend; known keys: {list(known)}")
            try:
                values[spec.key] = json.loads(bytes(spec.value).decode())
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"compile spec {spec.key!r} is not JSON: {exc}") from exc
        return cls(**values)


def generate_qnn_executorch_compiler_spec(soc_model: QcomChipset = DEFAULT_CHIPSET,
                                          backend_options: HtpBackendOptions | None = None, debug: bool = False,
                                          saver: bool = False, online_prepare: bool = False,
                                          profile: bool = False, shared_buffer: bool = False) -> list[CompileSpec]:
    """The compile specs of a ``QnnPartitioner`` (ExecuTorch's name and main arguments). ``online_prepare``
    (build the graph on the device at load time) and ``saver``/``shared_buffer`` are not supported: edgeport-qnn
    always stores a finalized context binary."""
    for name, value in (("saver", saver), ("online_prepare", online_prepare), ("shared_buffer", shared_buffer)):
        if value:
            raise ValueError(f"generate_qnn_executorch_compiler_spec: {name}=True is not supported by edgeport-qnn")
    if not isinstance(soc_model, QcomChipset):
        soc_model = QcomChipset[str(soc_model)] if str(soc_model) in QcomChipset.__members__ else QcomChipset(
            soc_model)
    options = backend_options if backend_options is not None else generate_htp_compiler_spec()
    return QnnCompileOptions(soc_model=soc_model.name, use_fp16=options.use_fp16).to_compile_specs()


@dataclass
class QnnRuntimeOptions(RuntimeOptions):
    """Given per method load: ``backend_options={"QnnBackend": {"soc_model": "SM8650"}}`` -- the SoC this
    machine is; a blob lowered for another SoC is refused at ``init``."""

    soc_model: str = DEFAULT_CHIPSET.name

    def __post_init__(self) -> None:
        if self.soc_model not in QcomChipset.__members__:
            raise ValueError(f"unknown soc_model {self.soc_model!r}; one of {list(QcomChipset.__members__)}")
