"""Portable kernels for ExecuTorch's LLM custom ops (``llama::``), so edgeport's runtime runs the programs of
ExecuTorch's tuned LLM flow (``export_llm`` with ``use_sdpa_with_kv_cache``, torch-free).

Semantics as ExecuTorch documents them (``executorch.extension.llm.custom_ops``: the op schemas, the meta
functions' checks and the reference implementations of its tests). The layout is ``[batch, seq, heads, head_dim]``
for queries, keys, values and caches (sequence at dim 1, not 2); a cache is ``[batch, max_context, kv_heads,
head_dim]``. Grouped-query attention: query head ``h`` reads kv head ``h // (heads / kv_heads)``.

* ``llama::update_cache.out(value, cache(a!), start_pos, *, out)``: ``cache[:, start_pos:start_pos + seq] = value``
  in place; ``out`` is a one-element placeholder nobody reads.
* ``llama::update_cache_with_indices.out(value, cache(a!), start_pos, indices, *, out)``:
  ``cache[b, indices[b, s]] = value[b, s]`` (``indices`` int64 ``[batch, seq]``; ``start_pos`` is not used).
* ``llama::custom_sdpa.out(query, key, value, start_pos, attn_mask=None, drpout_p=0, is_causal=False,
  scale=None, *, out)``: attention of ``query`` (positions ``start_pos .. start_pos + seq - 1``) over ``key`` /
  ``value`` (usually the whole caches). Without a mask it reads the first ``start_pos + seq`` keys, and with
  ``is_causal`` query ``i`` sees keys ``0 .. start_pos + i``. With ``attn_mask`` (float ``[seq, keys]``, added to
  the scores; not together with ``is_causal``) it reads every key of ``key``. ``scale`` defaults to
  ``1 / sqrt(head_dim)``; dropout is ignored (inference).
* ``llama::sdpa_with_kv_cache.out(query, key, value, key_cache(a!), value_cache(b!), start_pos, seq_len,
  attn_mask=None, drpout_p=0, is_causal=False, scale=None, *, out)``: ``update_cache`` of ``key`` and ``value``
  at ``start_pos``, then ``custom_sdpa`` of ``query`` over the caches.
* ``llama::fast_hadamard_transform.out(mat, *, out)``: the Walsh-Hadamard transform of the last dim (a power of
  two ``n``), scaled by ``1 / sqrt(n)`` (orthonormal; SpinQuant's rotations).

A position past the cache, mismatched shapes or dtypes, a non-power-of-two Hadamard size: each raises
:class:`~edgeport.errors.RuntimeExecutionError` naming the limit.
"""

from __future__ import annotations

import math

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.portable._common import kernel, resize

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))


def _rank4(name: str, x: np.ndarray, op: str) -> None:
    if x.ndim != 4:
        raise RuntimeExecutionError(f"{op}: {name} must be 4-dimensional [batch, seq, heads, head_dim], got shape "
                                    f"{list(x.shape)}")


def _check_update(value: np.ndarray, cache: np.ndarray, op: str) -> None:
    _rank4("value", value, op)
    _rank4("cache", cache, op)
    if value.dtype != cache.dtype:
        raise RuntimeExecutionError(f"{op}: value ({value.dtype}) and cache ({cache.dtype}) must have the same dtype")
    for d in (0, 2, 3):
        if value.shape[d] != cache.shape[d]:
            raise RuntimeExecutionError(f"{op}: value {list(value.shape)} and cache {list(cache.shape)} differ in "
                                        f"dim {d} (only dim 1, the sequence, may differ)")
    if not cache.flags.writeable:
        raise RuntimeExecutionError(f"{op}: the cache is read-only (a constant), it cannot be updated")


def _write_cache(value: np.ndarray, cache: np.ndarray, start_pos: int, op: str) -> None:
    _check_update(value, cache, op)
    start, seq, size = int(start_pos), value.shape[1], cache.shape[1]
    if start < 0:
        raise RuntimeExecutionError(f"{op}: start_pos {start} is negative")
    if start + seq > size:
        raise RuntimeExecutionError(
            f"{op}: writing {seq} position(s) from start_pos {start} runs past the cache of {size} positions "
            f"(start_pos + seq_len must be <= {size}); the program's max context length is {size}")
    cache[:, start:start + seq] = value


@kernel("llama::update_cache.out")
def update_cache_out(value, cache, start_pos, out):
    _write_cache(value, cache, start_pos, "llama::update_cache")
    return out


@kernel("llama::update_cache_with_indices.out")
def update_cache_with_indices_out(value, cache, start_pos, indices, out):
    op = "llama::update_cache_with_indices"
    _check_update(value, cache, op)
    if indices.ndim != 2 or indices.dtype != np.int64:
        raise RuntimeExecutionError(f"{op}: indices must be int64 [batch, seq], got {indices.dtype} "
                                    f"{list(indices.shape)}")
    if indices.shape != value.shape[:2]:
        raise RuntimeExecutionError(f"{op}: indices {list(indices.shape)} do not match value's [batch, seq] "
                                    f"{list(value.shape[:2])}")
    size = cache.shape[1]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= size):
        bad = int(indices[(indices < 0) | (indices >= size)][0])
        raise RuntimeExecutionError(f"{op}: index {bad} is outside the cache of {size} positions [0, {size})")
    batch = np.arange(value.shape[0])[:, None]
    cache[batch, indices] = value
    return out


def _attention(query: np.ndarray, key: np.ndarray, value: np.ndarray, start_pos: int, attn_mask: np.ndarray | None,
               is_causal: bool, scale: float | None, out: np.ndarray, op: str) -> np.ndarray:
    for name, x in (("query", query), ("key", key), ("value", value)):
        _rank4(name, x, op)
        if x.dtype not in _FLOATS:
            raise RuntimeExecutionError(f"{op}: {name} must be a float tensor, got {x.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeExecutionError(f"{op}: query ({query.dtype}), key ({key.dtype}) and value ({value.dtype}) "
                                    "must have the same dtype")
    if key.shape != value.shape:
        raise RuntimeExecutionError(f"{op}: key {list(key.shape)} and value {list(value.shape)} differ")
    b, seq, hq, d = query.shape
    kb, kv_len, hkv, kd = key.shape
    if kb != b or kd != d:
        raise RuntimeExecutionError(f"{op}: query {list(query.shape)} and key {list(key.shape)} differ in batch or "
                                    "head_dim")
    if hkv == 0 or hq % hkv:
        raise RuntimeExecutionError(f"{op}: {hq} query heads are not a multiple of {hkv} key/value heads")
    start = int(start_pos)
    if attn_mask is not None:
        if is_causal:
            raise RuntimeExecutionError(f"{op}: attn_mask and is_causal cannot both be set (the mask says which keys "
                                        "each query sees)")
        if attn_mask.ndim != 2 or attn_mask.dtype not in _FLOATS:
            raise RuntimeExecutionError(f"{op}: attn_mask must be a 2-D float tensor, got {attn_mask.dtype} "
                                        f"{list(attn_mask.shape)}")
        if attn_mask.shape != (seq, kv_len):
            raise RuntimeExecutionError(f"{op}: attn_mask {list(attn_mask.shape)} must be [seq, keys] = "
                                        f"[{seq}, {kv_len}]")
        n_keys = kv_len
    else:
        if start < 0:
            raise RuntimeExecutionError(f"{op}: start_pos {start} is negative")
        n_keys = start + seq
        if n_keys > kv_len:
            raise RuntimeExecutionError(
                f"{op}: {seq} query position(s) from start_pos {start} run past the {kv_len} cached positions "
                f"(start_pos + seq_len must be <= {kv_len}); the program's max context length is {kv_len}")
    if out.dtype != query.dtype:
        raise RuntimeExecutionError(f"{op}: out has dtype {out.dtype}, expected {query.dtype}")
    if out.shape != query.shape:
        out = resize(out, query.shape)
    rep = hq // hkv
    acc = np.float64 if query.dtype == np.float64 else np.float32
    # [b, hkv, rep, seq, d] x [b, hkv, 1, d, keys] -> [b, hkv, rep, seq, keys]
    q = query.astype(acc, copy=False).reshape(b, seq, hkv, rep, d).transpose(0, 2, 3, 1, 4)
    k = key[:, :n_keys].astype(acc, copy=False).transpose(0, 2, 3, 1)[:, :, None]
    v = value[:, :n_keys].astype(acc, copy=False).transpose(0, 2, 1, 3)[:, :, None]
    s = np.matmul(q, k)
    s *= acc(1.0 / math.sqrt(d) if scale is None else scale)
    if attn_mask is not None:
        s += attn_mask.astype(acc, copy=False)
    elif is_causal:
        allowed = np.arange(n_keys)[None, :] <= (start + np.arange(seq))[:, None]
        s += np.where(allowed, acc(0), acc(-np.inf))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    res = np.matmul(s, v)  # [b, hkv, rep, seq, d]
    np.copyto(out, res.transpose(0, 3, 1, 2, 4).reshape(b, seq, hq, d), casting="unsafe")
    return out


@kernel("llama::custom_sdpa.out")
def custom_sdpa_out(query, key, value, start_pos, attn_mask, drpout_p, is_causal, scale, out):
    return _attention(query, key, value, start_pos, attn_mask, bool(is_causal), scale, out, "llama::custom_sdpa")


@kernel("llama::sdpa_with_kv_cache.out")
def sdpa_with_kv_cache_out(query, key, value, key_cache, value_cache, start_pos, seq_len, attn_mask, drpout_p,
                           is_causal, scale, out):
    op = "llama::sdpa_with_kv_cache"
    if key_cache.shape != value_cache.shape:
        raise RuntimeExecutionError(f"{op}: key_cache {list(key_cache.shape)} and value_cache "
                                    f"{list(value_cache.shape)} differ")
    _rank4("query", query, op)
    if int(seq_len) != query.shape[1] or key.shape[:2] != query.shape[:2] or value.shape[:2] != query.shape[:2]:
        raise RuntimeExecutionError(f"{op}: seq_len {seq_len}, query {list(query.shape)}, key {list(key.shape)} and "
                                    f"value {list(value.shape)} disagree on [batch, seq]")
    _write_cache(key, key_cache, start_pos, op)
    _write_cache(value, value_cache, start_pos, op)
    return _attention(query, key_cache, value_cache, start_pos, attn_mask, bool(is_causal), scale, out, op)


@kernel("llama::fast_hadamard_transform.out")
def fast_hadamard_transform_out(mat, out):
    op = "llama::fast_hadamard_transform"
    if mat.ndim < 1 or mat.dtype not in _FLOATS:
        raise RuntimeExecutionError(f"{op}: expected a float tensor of rank >= 1, got {mat.dtype} "
                                    f"{list(mat.shape)}")
    n = mat.shape[-1]
    if n < 1 or n & (n - 1):
        raise RuntimeExecutionError(f"{op}: the last dim ({n}) must be a power of two")
    if out.shape != mat.shape:
        out = resize(out, mat.shape)
    acc = np.float64 if mat.dtype == np.float64 else np.float32
    x = mat.astype(acc, copy=True).reshape(-1, n)
    h = 1
    while h < n:  # butterflies: pairs (j, j + h) within blocks of 2h
        y = x.reshape(-1, n // (2 * h), 2, h)
        a, c = y[:, :, 0].copy(), y[:, :, 1]
        y[:, :, 0] += c
        y[:, :, 1] = a - c
        h *= 2
    x *= acc(1.0 / math.sqrt(n))
    np.copyto(out, x.reshape(mat.shape), casting="unsafe")
    return out
