"""What :func:`~edgeport.program.load_pte` returns: the Program plus zero-copy views, and the index checks that
need only the file (segments, constant data, delegate data, named data)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgeport.errors import ProgramError
from edgeport.program import schema
from edgeport.program.schema import DataLocation, Program, TensorDataLocation

__all__ = ["ExtendedHeader", "LoadedPte", "check_file_indices", "tensor_nbytes"]


@dataclass(frozen=True)
class ExtendedHeader:
    """The ``eh00`` header that follows the file identifier when segments are present."""

    length: int
    program_size: int
    segment_base_offset: int
    segment_data_size: int


@dataclass
class LoadedPte:
    """A parsed program plus zero-copy views into the original buffer."""

    program: Program
    data: memoryview
    program_size: int
    header: ExtendedHeader | None
    segments: list[memoryview]
    inline_constants: list[memoryview] = field(default_factory=list)
    inline_delegate_data: list[memoryview] = field(default_factory=list)
    external: Any = None  # edgeport.program.ptd.ExternalData: the .ptd files given with the program, if any

    def release(self) -> None:
        """Release this object's views of the buffer (e.g. before closing an mmap); views handed out to callers
        must be released by them."""
        for view in (self.data, *self.segments, *self.inline_constants, *self.inline_delegate_data):
            view.release()

    def __enter__(self) -> LoadedPte:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def num_constants(self) -> int:
        """Entries of constant data (including the reserved entry 0)."""
        cs = self.program.constant_segment
        return len(cs.offsets) if cs is not None and cs.offsets else len(self.program.constant_buffer)

    def constant(self, index: int) -> memoryview:
        """Bytes of constant ``index``: up to the next constant's start (padding included), like ExecuTorch."""
        cs = self.program.constant_segment
        if cs is not None and cs.offsets:
            if not 0 <= index < len(cs.offsets):
                raise ProgramError(f"constant index {index} out of range (0..{len(cs.offsets) - 1})")
            seg = self.segments[cs.segment_index] if len(cs.offsets) > 1 else self.data[0:0]
            end = cs.offsets[index + 1] if index + 1 < len(cs.offsets) else len(seg)
            return seg[cs.offsets[index]:max(end, cs.offsets[index])]
        if not 0 <= index < len(self.inline_constants):
            raise ProgramError(f"constant index {index} out of range (0..{len(self.inline_constants) - 1})")
        return self.inline_constants[index]

    def tensor_data(self, tensor: schema.Tensor, *, where: str = "tensor") -> memoryview:
        """Exactly the bytes of a constant tensor (or the initial value of a mutable one), bounds-checked."""
        nbytes = tensor_nbytes(tensor, where)
        idx = tensor.data_buffer_idx
        info = tensor.extra_tensor_info
        if info is not None and info.location == TensorDataLocation.EXTERNAL:
            raise ProgramError(f"{where}: data is external (key {info.fully_qualified_name!r}), not in this file")
        if idx == 0:
            raise ProgramError(f"{where}: has no constant data (data_buffer_idx 0)")
        if tensor.allocation_info is None:
            cs = self.program.constant_segment
            if cs is not None and cs.offsets:
                if idx >= len(cs.offsets):
                    raise ProgramError(f"{where}: data_buffer_idx {idx} out of range ({len(cs.offsets)} constants)")
                seg = self.segments[cs.segment_index]
                start = cs.offsets[idx]
            else:
                seg, start = self.constant(idx), 0
        else:
            mds = self.program.mutable_data_segments or []
            m = info.mutable_data_segments_idx if info is not None else 0
            if m >= len(mds) or idx >= len(mds[m].offsets):
                raise ProgramError(f"{where}: no mutable data entry {idx} in mutable_data_segments[{m}]")
            seg, start = self.segments[mds[m].segment_index], mds[m].offsets[idx]
        if start + nbytes > len(seg):
            raise ProgramError(f"{where}: {nbytes} bytes of data at offset {start} run past the end of its "
                               f"segment ({len(seg)} bytes)")
        return seg[start:start + nbytes]

    def delegate_data(self, plan: int | str, delegate_index: int) -> memoryview:
        """Processed bytes of ``execution_plan[plan].delegates[delegate_index]`` (inline or segment)."""
        plans = self.program.execution_plan
        if isinstance(plan, str):
            matches = [i for i, p in enumerate(plans) if p.name == plan]
            if not matches:
                raise ProgramError(f"no method named {plan!r}; methods: {[p.name for p in plans]}")
            plan = matches[0]
        if not 0 <= plan < len(plans) or not 0 <= delegate_index < len(plans[plan].delegates):
            raise ProgramError(f"no delegate {delegate_index} in execution_plan[{plan}]")
        ref = plans[plan].delegates[delegate_index].processed
        assert ref is not None  # checked by load_pte
        if ref.location == DataLocation.SEGMENT:
            return self.segments[ref.index]
        return self.inline_delegate_data[ref.index]

    def named_data(self, key: str) -> memoryview:
        """Bytes stored under ``key`` in ``Program.named_data``, else in the data files given with the program."""
        for entry in self.program.named_data or []:
            if entry.key == key:
                return self.segments[entry.segment_index]
        if self.external is not None:
            found = self.external.find(key)
            if found is not None:
                return found[0]
            raise ProgramError(f"no named data {key!r} in the program or in its data files {self.external.names}: "
                               "the .ptd given is not the one written with this program")
        raise ProgramError(f"no named data {key!r} in the program; if it was written with external data, pass its "
                           ".ptd file: load_program(pte, data_path=...)")

    def external_tensor(self, tensor: schema.Tensor, where: str = "tensor") -> memoryview:
        """The bytes of a constant stored outside the program, checked against the tensor the program declares."""
        info = tensor.extra_tensor_info
        key = info.fully_qualified_name if info is not None else None
        if not key:
            raise ProgramError(f"{where}: constant stored outside the program has no fully qualified name")
        if self.external is None:
            raise ProgramError(f"{where}: constant {key!r} is stored outside the program (external data); pass its "
                               ".ptd file: load_program(pte, data_path='<tag>.ptd')")
        found = self.external.find(key)
        if found is None:
            raise ProgramError(f"{where}: constant {key!r} is in none of the data files {self.external.names}: "
                               "the .ptd given is not the one written with this program")
        data, layout, name = found
        if layout is not None and (int(layout.scalar_type) != int(tensor.scalar_type)
                                   or list(layout.sizes) != list(tensor.sizes)):
            raise ProgramError(
                f"{where}: constant {key!r} in data file {name} is {_dtype_name(layout.scalar_type)}"
                f"{list(layout.sizes)}, the program expects {_dtype_name(tensor.scalar_type)}"
                f"{list(tensor.sizes)}: the .ptd belongs to another model")
        nbytes = tensor_nbytes(tensor, where)
        if len(data) < nbytes:
            raise ProgramError(f"{where}: constant {key!r} in data file {name} has {len(data)} bytes, the program "
                               f"expects {nbytes}: the .ptd belongs to another model or is corrupt")
        return data


def _dtype_name(value: int) -> str:
    try:
        return schema.ScalarType(int(value)).name
    except ValueError:
        return f"scalar type {int(value)}"


def tensor_nbytes(tensor: schema.Tensor, where: str = "tensor") -> int:
    """Byte size of ``tensor`` from its sizes and scalar type (``ProgramError`` if they are invalid)."""
    try:
        elem = schema.element_size(tensor.scalar_type)
    except ValueError:
        raise ProgramError(f"{where}: unknown scalar_type {int(tensor.scalar_type)}") from None
    if any(s < 0 for s in tensor.sizes):
        raise ProgramError(f"{where}: negative size in {tensor.sizes}")
    return math.prod(tensor.sizes) * elem


def check_file_indices(lp: LoadedPte) -> None:
    p = lp.program
    nseg = len(p.segments)

    def seg_index(index: int, where: str) -> None:
        if not 0 <= index < nseg:
            raise ProgramError(f"{where}: segment index {index} out of range ({nseg} segments)")

    cs = p.constant_segment
    if cs is not None and len(cs.offsets) > 1:
        if p.constant_buffer:
            raise ProgramError(f"program has both constant_buffer ({len(p.constant_buffer)} entries) and "
                               f"constant_segment.offsets ({len(cs.offsets)} entries)")
        seg_index(cs.segment_index, "constant_segment")
        size = len(lp.segments[cs.segment_index])
        for i, off in enumerate(cs.offsets):
            if off > size:
                raise ProgramError(f"constant_segment.offsets[{i}]: {off} is past the segment end ({size})")
    for m, sub in enumerate(p.mutable_data_segments or []):
        seg_index(sub.segment_index, f"mutable_data_segments[{m}]")
        size = len(lp.segments[sub.segment_index])
        for i, off in enumerate(sub.offsets):
            if off > size:
                raise ProgramError(f"mutable_data_segments[{m}].offsets[{i}]: {off} is past the segment end ({size})")
    keys: set[str] = set()
    for i, nd in enumerate(p.named_data or []):
        seg_index(nd.segment_index, f"named_data[{i}] ({nd.key!r})")
        if nd.key in keys:
            raise ProgramError(f"named_data[{i}]: duplicate key {nd.key!r}")
        keys.add(nd.key)
    nconst = lp.num_constants
    nmut = [len(s.offsets) for s in p.mutable_data_segments or []]
    for pi, plan in enumerate(p.execution_plan):
        for di, d in enumerate(plan.delegates):
            where = f"execution_plan[{pi}].delegates[{di}].processed"
            ref = d.processed
            if ref is None:
                raise ProgramError(f"{where}: missing")
            if ref.location == DataLocation.INLINE:
                if ref.index >= len(p.backend_delegate_data):
                    raise ProgramError(f"{where}: inline index {ref.index} out of range "
                                       f"({len(p.backend_delegate_data)} entries in backend_delegate_data)")
            elif ref.location == DataLocation.SEGMENT:
                seg_index(ref.index, where)
            else:
                raise ProgramError(f"{where}: unknown DataLocation {int(ref.location)}")
        for vi, value in enumerate(plan.values):
            t = value.val
            if type(t) is not schema.Tensor or t.data_buffer_idx == 0:
                continue
            where = f"execution_plan[{pi}].values[{vi}]"
            info = t.extra_tensor_info
            if info is not None:
                if info.location == TensorDataLocation.EXTERNAL:
                    continue
                if info.location != TensorDataLocation.SEGMENT:
                    raise ProgramError(f"{where}: unknown TensorDataLocation {int(info.location)}")
            if t.allocation_info is None:
                if t.data_buffer_idx >= nconst:
                    raise ProgramError(f"{where}: data_buffer_idx {t.data_buffer_idx} out of range "
                                       f"({nconst} constant entries)")
            else:
                m = info.mutable_data_segments_idx if info is not None else 0
                if m >= len(nmut) or t.data_buffer_idx >= nmut[m]:
                    raise ProgramError(f"{where}: data_buffer_idx {t.data_buffer_idx} has no entry in "
                                       f"mutable_data_segments[{m}]")
