"""Running what :mod:`edgeport_xnnpack.native` builds: ``xnn_runtime_t`` (:class:`Runtime`) and the channel-shuffle
operator (:class:`ChannelShuffle`), with checked, cached external-buffer bindings. Torch-free; import them from
``edgeport_xnnpack.native``.

The per-call work (check and bind the buffers, set up when a pointer changed, invoke) runs in the C extension
``edgeport_xnnpack._glue`` when it was built (``pip install`` compiles it; it needs a C compiler), else in the
equivalent Python :class:`_Bindings`. Both refuse the same numpy arrays with the same messages (the C path also
takes any other C-contiguous buffer of the right size, such as ``bytes`` for an input); the C path costs a few
microseconds per call
instead of tens right after XNNPACK has run with the interpreter's caches cold. :func:`glue_status` tells which
path runs; ``EDGEPORT_XNNPACK_GLUE=python`` forces the Python one.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from collections.abc import Sequence
from ctypes import c_void_p
from typing import Any

import numpy as np

from edgeport_xnnpack.native import (
    _PAGE,
    DATATYPE_ITEMSIZE,
    EXTRA_BYTES,
    FLAG_EXTERNAL_OUTPUT,
    Subgraph,
    ThreadPool,
    XnnpackError,
    _ExternalValue,
    _u32,
    library,
)

try:
    from edgeport_xnnpack import _glue
except ImportError as _exc:  # not compiled (no C compiler at install): the Python path runs
    _glue = None
    _GLUE_WHY = f"the C extension edgeport_xnnpack._glue is not built ({_exc}); reinstall with a C compiler"
else:
    _GLUE_WHY = ""
if _glue is not None and os.environ.get("EDGEPORT_XNNPACK_GLUE", "").lower() == "python":
    _glue = None
    _GLUE_WHY = "EDGEPORT_XNNPACK_GLUE=python"


def glue_status() -> tuple[str, str]:
    """``("c", "")`` when the C glue binds and invokes, else ``("python", why)``."""
    return ("c", "") if _glue is not None else ("python", _GLUE_WHY)


def _fn_address(fn: Any) -> int:
    return ctypes.cast(fn, c_void_p).value or 0


def _raise_status(call: str, status: int) -> None:
    library().check(status, call)


def _near_page_end(end: int) -> bool:
    """Whether reading ``EXTRA_BYTES`` past ``end`` (exclusive) may touch the next page."""
    return (end - 1) // _PAGE != (end - 1 + EXTRA_BYTES) // _PAGE


def padded_empty(shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialized C-contiguous, 64-byte aligned array followed by at least ``EXTRA_BYTES`` of its own
    memory and not ending within ``EXTRA_BYTES`` of a page end, so binding it as an input never needs staging."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    raw = np.empty(n + EXTRA_BYTES + 192, np.uint8)
    off = -raw.ctypes.data % 64
    if n and _near_page_end(raw.ctypes.data + off + n):
        off += 64
    return raw[off:off + n].view(dt).reshape(tuple(shape))


class _Bindings:
    """Checked pointers of the external buffers of one runtime or operator, remembered between calls.

    ``bind(arrays)`` validates each array (C-contiguous numpy array of the exact byte size; outputs writable),
    stages an input that ends within ``EXTRA_BYTES`` of a page end in a padded copy, and returns whether a
    pointer differs from the last bound one (the caller then re-runs XNNPACK's setup). No strong reference to
    the caller's arrays is kept: XNNPACK reads and writes bound memory during the call only, and each call
    binds its own arrays. ``pin(i, array)`` checks an array that will be bound at slot ``i`` on every call (an
    executor's own buffer) once; binding that same object later skips the checks.

    Reading an array's address (``a.ctypes.data``) is slow right after XNNPACK has run (tens of microseconds,
    with the interpreter's caches cold), so it is avoided where it is safe: an array that does not own its
    memory (a view, such as a planned output or a tensor's ``.numpy()``) can neither be resized nor re-pointed,
    so the same object (tracked by a weak reference) at the same slot keeps its checked address; a writable
    array is addressed through the buffer protocol, which is cheaper.
    """

    def __init__(self, names: Sequence[Any], nbytes: Sequence[int], outputs: Sequence[bool]) -> None:
        self.names, self.nbytes, self.outputs = list(names), list(nbytes), list(outputs)
        n = len(self.names)
        self.pinned: list[Any] = [None] * n
        self.pinned_ptr: list[int] = [0] * n
        self.ptrs: list[int] = [0] * n
        self.stage: list[np.ndarray | None] = [None] * n
        self.seen: list[Any] = [None] * n  # weak reference to the last view bound at each slot (its ptr in ptrs)
        self.valid = False  # setup succeeded with self.ptrs

    def pin(self, i: int, a: np.ndarray) -> bool:
        """Pin ``a`` to slot ``i`` if it is valid there and never needs staging; returns whether it was."""
        ptr, st = self._check(i, a)
        if st is not None:
            return False
        self.pinned[i], self.pinned_ptr[i] = a, ptr
        return True

    def _check(self, i: int, a: Any) -> tuple[int, np.ndarray | None]:
        nb = self.nbytes[i]
        if type(a) is not np.ndarray or not a.flags.c_contiguous or a.nbytes != nb:
            raise XnnpackError(f"external value {self.names[i]} needs a C-contiguous array of {nb} bytes")
        ptr = a.ctypes.data
        if self.outputs[i]:
            if not a.flags.writeable:
                raise XnnpackError(f"external output {self.names[i]} is read-only")
        elif nb and _near_page_end(ptr + nb):
            st = self.stage[i]
            if st is None or st.nbytes != nb + EXTRA_BYTES:
                st = np.empty(nb + EXTRA_BYTES, np.uint8)
            st[:nb] = a.reshape(-1).view(np.uint8)
            return st.ctypes.data, st
        return ptr, None

    def bind(self, arrays: Sequence[Any]) -> bool:
        if len(arrays) != len(self.names):
            raise XnnpackError(f"expected {len(self.names)} buffers ({self.names}), got {len(arrays)}")
        try:
            changed = not self.valid
            pinned, ptrs, nbytes, outputs, i = self.pinned, self.ptrs, self.nbytes, self.outputs, 0
            seen = self.seen
            for a in arrays:
                if a is pinned[i] and (not outputs[i] or a.flags.writeable):
                    ptr = self.pinned_ptr[i]
                    seen[i] = None
                elif seen[i] is not None and seen[i]() is a and (not outputs[i] or a.flags.writeable):
                    st = self.stage[i]  # the same view as last time: same address
                    if st is not None:
                        st[: nbytes[i]] = a.reshape(-1).view(np.uint8)
                    i += 1
                    continue
                elif type(a) is np.ndarray and a.flags.c_contiguous and a.nbytes == nbytes[i]:
                    flags = a.flags  # the common case, checked inline
                    ptr = _address(a, flags.writeable)
                    if outputs[i] and flags.writeable or not outputs[i] and not _near_page_end(ptr + nbytes[i]):
                        self.stage[i] = None
                    else:
                        ptr, self.stage[i] = self._check(i, a)  # raises, or stages the input
                    seen[i] = None if flags.owndata or not ptr else weakref.ref(a)
                else:
                    seen[i] = None
                    ptr, self.stage[i] = self._check(i, a)  # raises
                if ptr != ptrs[i]:
                    ptrs[i] = ptr
                    changed = True
                i += 1
            return changed
        except BaseException:
            self.valid = False  # some pointers may have been replaced: set up again next time
            self.seen = [None] * len(self.names)
            raise

    def overlapping(self) -> tuple[Any, Any] | None:
        """Names of an output and another external value whose bound memory overlaps (``None`` when none do)."""
        spans = [(p, p + nb) for p, nb in zip(self.ptrs, self.nbytes)]
        for i, (a0, a1) in enumerate(spans):
            if not self.outputs[i] or a0 == a1:
                continue
            for j, (b0, b1) in enumerate(spans):
                if j != i and b0 != b1 and not (j < i and self.outputs[j]) and a0 < b1 and b0 < a1:
                    return self.names[i], self.names[j]
        return None

    def clear(self) -> None:
        n = len(self.names)
        self.pinned, self.ptrs, self.stage, self.valid = [None] * n, [0] * n, [None] * n, False
        self.seen = [None] * n


_char = ctypes.c_char


class _Busy:
    """Refuses overlapping use of one runtime / operator on the Python path (ctypes releases the GIL inside the
    library calls, so another thread could re-point or delete it mid-call); the C glue has its own flag."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def hold(self, message: str) -> _Busy:
        """Take the flag (``with busy.hold(msg):``), or raise ``XnnpackError(message)`` if it is taken."""
        if not self._lock.acquire(blocking=False):
            raise XnnpackError(message)
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _NativeObject:
    """What :class:`Runtime` and :class:`ChannelShuffle` share: the C glue call (its refusals as
    ``XnnpackError``), the setup counter, and closing (refused while a call runs, on either path)."""

    handle: int | None
    glue: Any
    _setups: int
    _bindings: _Bindings

    @property
    def setups(self) -> int:
        """How many times the runtime / operator was set up (diagnostics)."""
        return self.glue.setups if self.glue is not None else self._setups

    def _glue_run(self, arrays: Sequence[Any]) -> None:
        try:
            self.glue.run(arrays)
        except (ValueError, RuntimeError) as exc:  # refused argument; running / deleted state
            raise exc if isinstance(exc, XnnpackError) else XnnpackError(str(exc)) from None

    def _delete(self, handle: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        glue = getattr(self, "glue", None)
        if glue is not None:
            try:
                glue.close()  # refuses (RuntimeError) while a call runs in another thread
            except RuntimeError as exc:
                raise XnnpackError(str(exc)) from None
        with (getattr(self, "_busy", None) or _Busy()).hold(_CLOSING):  # (init may have failed early)
            if getattr(self, "handle", None):
                self._delete(self.handle)
            self.handle = None
            if hasattr(self, "_bindings"):
                self._bindings.clear()

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


_RUNNING = "this XNNPACK runtime is already running (calls must not overlap)"
_CLOSING = "cannot close an XNNPACK runtime while it runs"


def _address(a: np.ndarray, writeable: bool) -> int:
    """The address of a C-contiguous array's first byte (0 for an empty array)."""
    if writeable and a.nbytes:
        return ctypes.addressof(_char.from_buffer(a))
    return a.ctypes.data


class Runtime(_NativeObject):
    """An ``xnn_runtime_t`` built from a :class:`Subgraph`; owns what XNNPACK still points to after creation.

    Static data that XNNPACK packs at creation (convolution / fully-connected filters and biases read by no
    other node) is *not* retained, so the caller may release it; all other static data is kept alive here.
    ``xnn_setup_runtime`` runs only when a bound pointer changed since the last successful setup.
    """

    def __init__(self, subgraph: Subgraph, pool: ThreadPool | None = None, flags: int = 0) -> None:
        self.lib = subgraph.lib
        h = c_void_p()
        status = self.lib.xnn.xnn_create_runtime_v2(subgraph._h(), pool.handle if pool else None,
                                                    _u32(flags, "runtime flags"), ctypes.byref(h))
        self.lib.check(status, "xnn_create_runtime_v2")
        self.handle: int | None = h.value
        self.pool = pool
        self.keep = {vid: arr for vid, arr in subgraph.static.items()
                     if vid < 0 or subgraph._reads.get(vid, {"input"}) != {"weight"}}
        self.externals = {vid: (dt, dims, subgraph.flags[vid]) for vid, (dt, dims) in subgraph.shapes.items()
                          if subgraph.flags.get(vid)}
        self.order = list(self.externals)  # the external value ids in the order run_list takes buffers
        self._ext = (_ExternalValue * max(len(self.order), 1))()
        for i, vid in enumerate(self.order):
            self._ext[i].id = vid
        self._bindings = _Bindings(self.order, [self.nbytes(v) for v in self.order],
                                   [bool(self.externals[v][2] & FLAG_EXTERNAL_OUTPUT) for v in self.order])
        self._setups = 0
        self._busy = _Busy()
        self._xnn = self.lib.xnn
        self.glue = None if _glue is None else _glue.Binding(
            _glue.KIND_RUNTIME, self.handle, _fn_address(self._xnn.xnn_setup_runtime),
            _fn_address(self._xnn.xnn_invoke_runtime), self.order, self._bindings.nbytes, self._bindings.outputs,
            EXTRA_BYTES, _PAGE, _raise_status)

    def pin(self, buffers: dict[int, np.ndarray]) -> None:
        """Check once arrays that :meth:`run_list` will get for these external ids on every call (see
        ``_Bindings.pin``); they are referenced until :meth:`close`."""
        for vid, a in buffers.items():
            self._bindings.pin(self.order.index(vid), a)

    @property
    def _scratch(self) -> dict[int, np.ndarray]:
        """Inputs currently staged in padded copies (value id -> staging buffer; ``None`` for the C glue's own)."""
        b = self._bindings
        if self.glue is not None:
            return {b.names[i]: None for i in self.glue.staged}
        return {vid: st for vid, st in zip(b.names, b.stage, strict=True) if st is not None}

    def nbytes(self, vid: int) -> int:
        dt, dims, _ = self.externals[vid]
        return math.prod(dims) * DATATYPE_ITEMSIZE[dt]

    def run(self, buffers: dict[int, np.ndarray]) -> None:
        """Bind every external value (id -> numpy buffer) and invoke; see :meth:`run_list`."""
        if not self.handle:
            raise XnnpackError("the runtime was deleted")
        if set(buffers) != set(self.externals):
            raise XnnpackError(f"external values {sorted(self.externals)} expected, got {sorted(buffers)}")
        self.run_list([buffers[vid] for vid in self.order])

    def run_list(self, arrays: Sequence[np.ndarray]) -> None:
        """Bind ``arrays`` (one per id of :attr:`order`) without copying them, except an input that ends within
        ``EXTRA_BYTES`` of a page boundary (staged in a padded buffer), set up if a pointer changed, invoke."""
        handle = self.handle
        if not handle:
            raise XnnpackError("the runtime was deleted")
        if self.glue is not None:
            self._glue_run(arrays)
            return
        with self._busy.hold(_RUNNING):
            handle = self.handle
            if not handle:
                raise XnnpackError("the runtime was deleted")
            b = self._bindings
            if b.bind(arrays):
                b.valid = False
                clash = b.overlapping()
                if clash is not None:
                    raise XnnpackError(f"external values {clash[0]} and {clash[1]} overlap (an output must have "
                                       "memory of its own)")
                for i, ptr in enumerate(b.ptrs):
                    self._ext[i].data = ptr
                self.lib.check(self.lib.xnn.xnn_setup_runtime(handle, len(b.ptrs), self._ext), "xnn_setup_runtime")
                b.valid = True
                self._setups += 1
            status = self._xnn.xnn_invoke_runtime(handle)
            if status:
                self.lib.check(status, "xnn_invoke_runtime")

    def _delete(self, handle: int) -> None:
        self.lib.xnn.xnn_delete_runtime(handle)
        self.keep = {}


class ChannelShuffle(_NativeObject):
    """XNNPACK's ``channel_shuffle_nc_x32`` (``element_size=4``) or ``channel_shuffle_nc_x8`` (``element_size=1``)
    operator: ``batch`` items of ``[groups, group_channels]`` elements transposed to ``[group_channels, groups]``
    (groups = C, group_channels = H*W is NCHW -> NHWC; the reverse is groups = H*W, group_channels = C). Created
    once; set up again only when a pointer changes; runs on ``pool``. ``close()`` deletes the operator."""

    def __init__(self, batch: int, groups: int, group_channels: int, pool: ThreadPool | None = None,
                 element_size: int = 4) -> None:
        self.lib = library()
        if element_size not in (1, 4):
            raise XnnpackError(f"channel shuffle moves 1- or 4-byte elements, not {element_size!r}")
        bits = 8 * element_size
        if not (self.lib.operators if element_size == 4 else self.lib.operators_x8):
            raise XnnpackError(f"this libXNNPACK has no channel_shuffle_nc_x{bits} operator")
        for what, v in (("batch", batch), ("groups", groups), ("group_channels", group_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
                raise XnnpackError(f"channel shuffle {what} must be an int in 1..2**31-1, got {v!r}")
        if groups < 2:
            raise XnnpackError("channel shuffle needs at least 2 groups")
        self.batch, self.groups, self.group_channels = batch, groups, group_channels
        self.element_size = element_size
        self.pool = pool
        c = groups * group_channels
        h = c_void_p()
        xnn = self.lib.xnn
        create = xnn.xnn_create_channel_shuffle_nc_x32 if element_size == 4 else xnn.xnn_create_channel_shuffle_nc_x8
        self._setup_fn = (xnn.xnn_setup_channel_shuffle_nc_x32 if element_size == 4
                          else xnn.xnn_setup_channel_shuffle_nc_x8)
        self._setup_name = f"xnn_setup_channel_shuffle_nc_x{bits}"
        self.lib.check(create(groups, group_channels, c, c, 0, ctypes.byref(h)),
                       f"xnn_create_channel_shuffle_nc_x{bits}")
        self.handle: int | None = h.value
        self._bindings = _Bindings(["input", "output"], [batch * c * element_size] * 2, [False, True])
        self._setups = 0
        self._busy = _Busy()
        self._xnn = xnn
        self._pool_handle = pool.handle if pool else None
        self.glue = None if _glue is None else _glue.Binding(
            _glue.KIND_SHUFFLE, self.handle, _fn_address(self._setup_fn), _fn_address(xnn.xnn_run_operator),
            [0, 1], self._bindings.nbytes, self._bindings.outputs, EXTRA_BYTES, _PAGE, _raise_status,
            self._pool_handle, batch, **({"element_size": 1} if element_size == 1 else {}))

    def pin(self, src: np.ndarray | None = None, dst: np.ndarray | None = None) -> None:
        """Check once the input / output array that every later :meth:`run` binds (see ``_Bindings.pin``)."""
        for i, a in enumerate((src, dst)):
            if a is not None:
                self._bindings.pin(i, a)

    def run(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (elements of ``element_size`` bytes, exact byte size, writable) = the shuffled ``src``; they must
        not overlap."""
        handle = self.handle
        if not handle:
            raise XnnpackError("the channel shuffle operator was deleted")
        if self.glue is not None:
            self._glue_run((src, dst))
            return
        with self._busy.hold(_RUNNING):
            handle = self.handle
            if not handle:
                raise XnnpackError("the channel shuffle operator was deleted")
            b = self._bindings
            changed = b.bind((src, dst))
            if src.itemsize != self.element_size or dst.itemsize != self.element_size:
                b.valid = False
                raise XnnpackError(f"channel shuffle moves {8 * self.element_size}-bit elements")
            if changed:
                b.valid = False
                if np.shares_memory(src, dst):
                    raise XnnpackError("channel shuffle input and output overlap")
                self.lib.check(self._setup_fn(handle, self.batch, b.ptrs[0], b.ptrs[1], self._pool_handle),
                               self._setup_name)
                b.valid = True
                self._setups += 1
            status = self._xnn.xnn_run_operator(handle, self._pool_handle)
            if status:
                self.lib.check(status, "xnn_run_operator")

    def _delete(self, handle: int) -> None:
        self.lib.xnn.xnn_delete_operator(handle)
