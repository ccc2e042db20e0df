"""The planning context of a ``VkGraph`` (see :mod:`edgeport_vulkan._plan`): the :class:`Plan` being built, its
:class:`Dispatch` records, and :class:`PlanContext`, which checks values, tensors and shapes for the operator
planners (:mod:`edgeport_vulkan._plan_compute`, :mod:`edgeport_vulkan._plan_views`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.errors import ProgramError

from ._launch import coalesce
from .schema import (
    Bool,
    Double,
    Int,
    IntList,
    Null,
    String,
    VkDataType,
    VkGraph,
    VkTensor,
)

MAX_DIMS = 6
MAX_NUMEL = (2**31 - 1) // 4
MAX_GROUPS = 65535
F32_MAX = float(np.finfo(np.float32).max)
#: operators that may read or write zero-element tensors: data movement, where an empty tensor needs no dispatch
#: (aliases and copies of nothing; ``cat`` skips empty inputs). Every other operator is refused one at planning,
#: and the partitioner keeps such nodes off the backend (:mod:`edgeport_vulkan.capabilities`).
ZERO_ELEMENT_OPS = frozenset({
    "aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
    "aten.unsqueeze_copy.default", "aten.clone.default", "aten.permute_copy.default", "aten.cat.default",
    "aten.slice_copy.Tensor", "aten.select_copy.int", "aten.expand_copy.default",
    "aten.split_with_sizes_copy.default", "aten.alias_copy.default",
})
#: element kinds of device tensors (every buffer element is a 32-bit word, or 16 bits for FLOAT16 storage); the
#: ``ewise`` shader's type codes
FLOAT, INT, BOOL = 0, 1, 2
KIND_NAMES = {FLOAT: "float", INT: "int32", BOOL: "bool"}


@dataclass
class Dispatch:
    shader: str
    tensors: list[int]  # tensor ids (or synthetic constants' ids) bound in order
    fmt: str
    values: list[int | float]
    groups: tuple[int, int, int]
    spec: tuple[int, ...] = ()
    node_id: int = -1  # the OperatorCall's node_id (the delegate debug id of its edge node)


@dataclass
class Plan:
    dims: dict[int, tuple[int, ...]]  # every float tensor the plan touches
    storage: dict[int, int]  # tensor id -> id of the tensor owning its buffer (views alias)
    constants: dict[int, np.ndarray]  # owning id -> float32 data (weights and synthetic scalars)
    inputs: list[int]
    outputs: list[int]
    dispatches: list[Dispatch]
    op_counts: dict[str, int] = field(default_factory=dict)
    fp16: bool = False  # FLOAT16 tensors (storage); the runtime still exchanges float32 arrays
    kinds: dict[int, int] = field(default_factory=dict)  # tensor id -> INT / BOOL (absent: FLOAT)
    status: int | None = None  # id of the 1-word buffer the gather shader flags an out-of-range index in


def dispatch_groups(n: int, local: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // local), MAX_GROUPS)), 1, 1)


class PlanContext:
    def __init__(self, graph: VkGraph, constant_data: Callable[[int, int], np.ndarray], where: str) -> None:
        self.g = graph
        self.where = where
        self.values = graph.values
        self.constant_data = constant_data
        self.defined: set[int] = set()
        self.plan = Plan({}, {}, {}, [], [], [])
        self._next_synthetic = -1
        self.op = ""
        self.node_id = -1
        self.unused: set[int] = set()
        self.float_type: int | None = None  # FLOAT32, or FLOAT16 for graphs lowered with force_fp16  # declared auxiliary outputs the shaders never compute

    # -- errors and values ----------------------------------------------------------------------------------
    def fail(self, msg: str) -> ProgramError:
        return ProgramError(f"{self.where}: {self.op + ': ' if self.op else ''}{msg}")

    def value(self, vid: Any) -> Any:
        if not isinstance(vid, int) or not 0 <= vid < len(self.values):
            raise self.fail(f"value id {vid!r} is outside the graph's {len(self.values)} values")
        return self.values[vid].value

    def tensor_decl(self, vid: int) -> VkTensor:
        v = self.value(vid)
        if not isinstance(v, VkTensor):
            raise self.fail(f"value {vid} is a {type(v).__name__}, expected a tensor")
        return v

    def float_dims(self, vid: int, t: VkTensor) -> tuple[int, ...]:
        dims, kind = self.typed_dims(vid, t)
        if kind != FLOAT:
            raise self.fail(f"tensor {vid} has datatype {dtype_name(t.datatype)}; this operator computes FLOAT32 / "
                            "FLOAT16 tensors only")
        return dims

    def typed_dims(self, vid: int, t: VkTensor) -> tuple[tuple[int, ...], int]:
        """Dims and element kind (FLOAT, INT, BOOL) of a declared tensor."""
        if t.datatype in (VkDataType.FLOAT32, VkDataType.FLOAT16):
            kind = FLOAT
            if self.float_type is None:
                self.float_type = int(t.datatype)
            elif self.float_type != t.datatype:
                raise self.fail(f"tensor {vid} is {dtype_name(t.datatype)} while others are "
                                f"{dtype_name(self.float_type)}: a graph is all FLOAT32 or all FLOAT16 (force_fp16)")
        elif t.datatype in (VkDataType.INT32, VkDataType.BOOL):
            kind = INT if t.datatype == VkDataType.INT32 else BOOL
        else:
            raise self.fail(f"tensor {vid} has datatype {dtype_name(t.datatype)}; only FLOAT32 / FLOAT16, INT32 and "
                            "BOOL tensors are computed")
        dims = self._checked_dims(vid, t)
        if kind != FLOAT:
            self.plan.kinds[vid] = kind
        return dims, kind

    def _checked_dims(self, vid: int, t: VkTensor) -> tuple[int, ...]:
        dims = tuple(int(d) for d in t.dims)
        if len(dims) > MAX_DIMS:
            raise self.fail(f"tensor {vid} has {len(dims)} dims (max {MAX_DIMS})")
        n = math.prod(dims)
        if n > MAX_NUMEL:
            raise self.fail(f"tensor {vid} has {n} elements (at most {MAX_NUMEL} supported)")
        return dims

    def _check_empty(self, vid: int, dims: tuple[int, ...], what: str) -> None:
        if math.prod(dims) == 0 and self.op and self.op not in ZERO_ELEMENT_OPS:
            raise self.fail(f"{what} tensor {vid} {list(dims)} has no elements; only data-movement operators "
                            "take empty tensors")

    def tensor(self, vid: int, what: str = "input") -> tuple[int, ...]:
        """Dims of a float tensor read by the current operator (it must be defined already)."""
        dims, kind = self.typed(vid, what)
        if kind != FLOAT:
            raise self.fail(f"{what} tensor {vid} is {KIND_NAMES[kind]}; this operator computes float tensors only")
        return dims

    def typed(self, vid: int, what: str = "input") -> tuple[tuple[int, ...], int]:
        """Dims and element kind of a tensor of any kind read by the current operator."""
        t = self.tensor_decl(vid)
        dims, kind = self.typed_dims(vid, t)
        if vid not in self.defined:
            raise self.fail(f"{what} tensor {vid} is read before any operator writes it")
        self._check_empty(vid, dims, what)
        return dims, kind

    def out(self, vid: int, expected: tuple[int, ...] | None = None) -> tuple[int, ...]:
        dims, kind = self.out_typed(vid, expected)
        if kind != FLOAT:
            raise self.fail(f"output tensor {vid} is {KIND_NAMES[kind]}; this operator computes float tensors only")
        return dims

    def out_typed(self, vid: int, expected: tuple[int, ...] | None = None,
                  kind: int | None = None) -> tuple[tuple[int, ...], int]:
        """Declares the output ``vid`` written (of element kind ``kind`` when given); returns its dims and kind."""
        t = self.tensor_decl(vid)
        dims, declared = self.typed_dims(vid, t)
        if kind is not None and declared != kind:
            raise self.fail(f"output tensor {vid} is declared {dtype_name(t.datatype)}, the operator produces "
                            f"{KIND_NAMES[kind]}")
        if vid in self.defined:
            raise self.fail(f"output tensor {vid} is written twice (or is an input / constant)")
        if expected is not None and tuple(expected) != dims:
            raise self.fail(f"output tensor {vid} is declared {list(dims)}, the operator produces {list(expected)}")
        self._check_empty(vid, dims, "output")
        self.defined.add(vid)
        self.plan.dims[vid] = dims
        self.plan.storage[vid] = vid
        return dims, declared

    def is_null(self, vid: int) -> bool:
        return isinstance(self.value(vid), Null)

    def int_(self, vid: int, what: str) -> int:
        v = self.value(vid)
        if isinstance(v, Int):
            return int(v.int_val)
        if isinstance(v, Bool):
            return int(v.bool_val)
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected an Int")

    def num(self, vid: int, what: str) -> float:
        v = self.value(vid)
        if isinstance(v, Double):
            f = float(v.double_val)
        elif isinstance(v, Int):
            f = float(v.int_val)
        else:
            raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a number")
        if math.isnan(f):
            raise self.fail(f"{what} is NaN")
        return f

    def flag(self, vid: int, what: str) -> bool:
        v = self.value(vid)
        if isinstance(v, Bool):
            return bool(v.bool_val)
        if isinstance(v, Int) and v.int_val in (0, 1):
            return bool(v.int_val)
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a Bool")

    def ints(self, vid: int, what: str, n: int | None = None) -> list[int]:
        v = self.value(vid)
        if isinstance(v, Int):
            items = [int(v.int_val)] * (n or 1)
        elif isinstance(v, IntList):
            items = [int(x) for x in v.items]
        else:
            raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected an IntList")
        if n is not None and len(items) == 1 and n > 1:
            items = items * n
        if n is not None and len(items) != n:
            raise self.fail(f"{what} has {len(items)} items, expected {n}")
        if any(abs(x) > 2**30 for x in items):
            raise self.fail(f"{what} {items} has out-of-range items")
        return items

    def string(self, vid: int, what: str) -> str | None:
        v = self.value(vid)
        if isinstance(v, Null):
            return None
        if isinstance(v, String):
            return v.string_val
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a String")

    def dim(self, d: int, rank: int, what: str = "dim") -> int:
        r = max(rank, 1)
        if not -r <= d < r:
            raise self.fail(f"{what} {d} is out of range for rank {rank}")
        return d % r

    def synthetic(self, data: np.ndarray, kind: int = FLOAT) -> int:
        """A constant made by the plan (float32, or int32 words for INT / BOOL)."""
        vid = self._next_synthetic
        self._next_synthetic -= 1
        arr = np.ascontiguousarray(data, dtype=np.float32 if kind == FLOAT else np.int32).reshape(-1)
        self.plan.dims[vid] = (arr.size,)
        self.plan.storage[vid] = vid
        self.plan.constants[vid] = arr
        if kind != FLOAT:
            self.plan.kinds[vid] = kind
        return vid

    def status(self) -> int:
        """The plan's status word (gather's out-of-range flag), made on first use."""
        if self.plan.status is None:
            self.plan.status = self.synthetic(np.zeros(1, np.int32), INT)
        return self.plan.status

    def dummy(self) -> int:
        return self.synthetic(np.zeros(1, np.float32))

    def dispatch(self, shader: str, tensors: list[int], fmt: str, values: list[int | float],
                 groups: tuple[int, int, int], spec: tuple[int, ...] = ()) -> None:
        # float push constants are fp32: a double beyond its range (ExecuTorch writes DBL_MAX for "no clamp")
        # becomes an infinity of the same sign
        values = [math.copysign(math.inf, v) if isinstance(v, float) and abs(v) > F32_MAX else v for v in values]
        self.plan.dispatches.append(Dispatch(shader, tensors, fmt, values, groups, spec, self.node_id))

    def alias(self, out: int, src: int) -> None:
        src_dims = self.plan.dims[src]
        dims, _ = self.out_typed(out, None, self.plan.kinds.get(src, FLOAT))
        if math.prod(dims) != math.prod(src_dims):
            raise self.fail(f"view of {list(src_dims)} as {list(dims)} changes the element count")
        self.plan.storage[out] = self.plan.storage[src]

    def coalesce(self, shape: Any, *strides: Any) -> tuple[list[int], list[list[int]]]:
        try:
            return coalesce(shape, *strides)
        except ValueError as exc:
            raise self.fail(str(exc)) from None


def dtype_name(v: int) -> str:
    try:
        return VkDataType(v).name
    except ValueError:
        return str(v)


def check_nargs(ctx: PlanContext, args: list[int], lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(args) <= hi:
        raise ctx.fail(f"{len(args)} argument ids, expected {lo}..{hi} (inputs then output)")
