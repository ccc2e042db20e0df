"""Numbers and tables of :mod:`edgeport.devtools.validate`: error statistics, per-partition rows, the report.

Torch-free (numpy, imported when arrays are compared): a report can be built, formatted and serialized without
torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SQNR_THRESHOLD_DB", "ErrorStats", "PartitionValidation", "ValidationReport", "error_stats"]

#: Default SQNR a result must reach (dB). fp32 delegates reach 100+ dB against eager torch; int8 ones, judged
#: against their own q/dq subgraph, typically 30+ dB (one quantization step here and there).
DEFAULT_SQNR_THRESHOLD_DB = 25.0


@dataclass
class ErrorStats:
    """Error of some outputs against their reference, over every element of every output (and sample).

    ``max_rel`` is ``max_abs`` divided by the reference's largest magnitude; ``sqnr_db`` is
    ``10 log10(sum ref^2 / sum (out - ref)^2)`` (``inf`` when the outputs are exact).
    """

    max_abs: float = 0.0
    ref_max_abs: float = 0.0
    signal_power: float = 0.0
    noise_power: float = 0.0
    numel: int = 0
    mismatch: str = ""  # a shape/count mismatch: the outputs could not be compared

    @property
    def max_rel(self) -> float:
        if self.max_abs == 0.0:
            return 0.0
        return self.max_abs / self.ref_max_abs if self.ref_max_abs > 0 else math.inf

    @property
    def sqnr_db(self) -> float:
        if self.mismatch or not math.isfinite(self.noise_power):
            return -math.inf
        if self.noise_power == 0.0:
            return math.inf
        if self.signal_power == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal_power / self.noise_power)

    def add(self, other: ErrorStats) -> None:
        """Accumulate another sample's statistics into these."""
        self.max_abs = max(self.max_abs, other.max_abs)
        self.ref_max_abs = max(self.ref_max_abs, other.ref_max_abs)
        self.signal_power += other.signal_power
        self.noise_power += other.noise_power
        self.numel += other.numel
        self.mismatch = self.mismatch or other.mismatch

    def within(self, atol: float | None, rtol: float | None, sqnr_threshold_db: float) -> bool:
        """Whether these errors meet every threshold given (``None`` skips that check)."""
        if self.mismatch:
            return False
        if atol is not None and not self.max_abs <= atol:
            return False
        if rtol is not None and not self.max_rel <= rtol:
            return False
        return self.sqnr_db >= sqnr_threshold_db

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs": _num(self.max_abs), "max_rel": _num(self.max_rel), "sqnr_db": _num(self.sqnr_db),
                "ref_max_abs": _num(self.ref_max_abs), "numel": self.numel, "mismatch": self.mismatch or None}


def _num(x: float) -> float | str:
    """A float for JSON: ``inf``/``nan`` become strings (JSON has no such numbers)."""
    return x if math.isfinite(x) else str(x)


def error_stats(outputs: Sequence[Any], references: Sequence[Any]) -> ErrorStats:
    """Compare arrays elementwise in float64. NaN where the reference has NaN counts as exact; NaN or inf
    anywhere else makes the error infinite."""
    import numpy as np

    st = ErrorStats()
    if len(outputs) != len(references):
        st.mismatch = f"{len(outputs)} outputs, the reference has {len(references)}"
        return st
    for i, (o, r) in enumerate(zip(outputs, references, strict=True)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            st.mismatch = f"output {i}: shape {list(o.shape)}, the reference's is {list(r.shape)}"
            return st
        o64, r64 = o.astype(np.float64), r.astype(np.float64)
        same = (o64 == r64) | (np.isnan(o64) & np.isnan(r64))  # equal infinities and NaN/NaN count as exact
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(same, 0.0, np.abs(o64 - r64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        finite_ref = np.where(np.isfinite(r64), r64, 0.0)
        st.numel += int(o.size)
        if o.size:
            st.max_abs = max(st.max_abs, float(diff.max()))
            st.ref_max_abs = max(st.ref_max_abs, float(np.abs(finite_ref).max()))
            st.signal_power += float(np.square(finite_ref).sum())
            with np.errstate(over="ignore"):
                st.noise_power += float(np.square(diff).sum())
    return st


@dataclass
class PartitionValidation:
    """One delegate call, run alone on its reference inputs, against its original subgraph in eager torch."""

    index: int  # position in execution order
    name: str  # the graph node of the call (``executorch_call_delegate``-like) and its lowered module
    backend_id: str
    ops: dict[str, int]  # op name -> count in the partition's original subgraph
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    stats: ErrorStats
    passed: bool = True
    worst_node: str = ""  # where the backend exposes intermediates; else the reason it is not known
    worst_node_stats: ErrorStats | None = None
    error: str = ""  # the delegate failed to run

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "backend_id": self.backend_id, "ops": dict(self.ops),
                "input_shapes": self.input_shapes, "output_shapes": self.output_shapes,
                **self.stats.to_dict(), "passed": self.passed, "worst_node": self.worst_node,
                "worst_node_stats": self.worst_node_stats.to_dict() if self.worst_node_stats else None,
                "error": self.error or None}


@dataclass
class ValidationReport:
    """What :func:`~edgeport.devtools.validate.validate` found: the whole program and each partition."""

    whole: ErrorStats
    whole_passed: bool
    partitions: list[PartitionValidation]
    samples: int
    atol: float | None = None
    rtol: float | None = None
    sqnr_threshold_db: float = DEFAULT_SQNR_THRESHOLD_DB
    notes: list[str] = field(default_factory=list)
    whole_error: str = ""  # the program failed to run on the runtime

    @property
    def passed(self) -> bool:
        """The whole program and every partition are within the thresholds."""
        return self.whole_passed and all(p.passed for p in self.partitions)

    @property
    def worst(self) -> PartitionValidation | None:
        """The partition with the lowest SQNR (ties: the larger max abs error); ``None`` without partitions."""
        if not self.partitions:
            return None
        return min(self.partitions, key=lambda p: (p.stats.sqnr_db, -p.stats.max_abs))

    @property
    def first_failing(self) -> PartitionValidation | None:
        """The first partition (in execution order) outside the thresholds, if any."""
        return next((p for p in self.partitions if not p.passed), None)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "passed": self.passed, "samples": self.samples,
            "thresholds": {"atol": self.atol, "rtol": self.rtol, "sqnr_db": self.sqnr_threshold_db},
            "whole_program": {**self.whole.to_dict(), "passed": self.whole_passed, "error": self.whole_error or None},
            "partitions": [p.to_dict() for p in self.partitions],
            "worst_partition": worst.index if worst is not None else None,
            "notes": list(self.notes),
        }

    def format(self) -> str:
        """A text table: the whole program, then one row per partition, then the notes."""
        limits = [f"SQNR >= {self.sqnr_threshold_db:g} dB"]
        if self.atol is not None:
            limits.append(f"max abs <= {self.atol:g}")
        if self.rtol is not None:
            limits.append(f"max rel <= {self.rtol:g}")
        lines = [f"numerical validation: {self.samples} sample(s); pass: {', '.join(limits)}"]
        header = ["#", "partition", "backend", "ops", "max abs", "max rel", "SQNR dB", "result"]
        rows = [["-", "whole program", "runtime vs eager", "-", *_cells(self.whole),
                 _verdict(self.whole_passed, self.whole_error or self.whole.mismatch)]]
        for p in self.partitions:
            rows.append([str(p.index), p.name, p.backend_id, _clip(_ops_text(p.ops), 40), *_cells(p.stats),
                         _verdict(p.passed, p.error or p.stats.mismatch)])
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        fmt_row = "  ".join(f"{{:<{w}}}" for w in widths)
        lines.append(fmt_row.format(*header).rstrip())
        lines.extend(fmt_row.format(*r).rstrip() for r in rows)
        if self.partitions:
            lines.append("")
            lines.append("per partition: shapes, worst node")
            for p in self.partitions:
                node = p.worst_node
                if p.worst_node_stats is not None:
                    node += (f" (max abs {_g(p.worst_node_stats.max_abs)}, "
                             f"SQNR {_g(p.worst_node_stats.sqnr_db)} dB)")
                lines.append(f"  {p.index}: in {p.input_shapes} -> out {p.output_shapes}; worst node: {node}")
        first = self.first_failing
        if first is not None:
            lines.append(f"first diverging partition: {first.index} ({first.name}, {first.backend_id})")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _ops_text(ops: dict[str, int]) -> str:
    """Compute ops (``aten.`` and ``.default`` dropped, ``xN`` for repeats), then the q/dq ops as one count."""
    parts, qdq = [], 0
    for k, v in ops.items():
        if k.startswith("quantized_decomposed."):
            qdq += v
            continue
        name = k.removeprefix("aten.").removesuffix(".default")
        parts.append(f"{name}x{v}" if v > 1 else name)
    if qdq:
        parts.append(f"q/dq x{qdq}")
    return ", ".join(parts)


def _g(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _cells(st: ErrorStats) -> list[str]:
    if st.mismatch:
        return ["-", "-", "-"]
    return [_g(st.max_abs), _g(st.max_rel), f"{st.sqnr_db:.1f}" if math.isfinite(st.sqnr_db) else str(st.sqnr_db)]


def _verdict(ok: bool, why: str) -> str:
    if why:
        return f"FAIL: {why}"
    return "ok" if ok else "FAIL"


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."
