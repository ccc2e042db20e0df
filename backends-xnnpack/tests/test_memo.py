"""The planning caches' bounded memo (``_memo.BoundedMemo``) against the least-recently-used rule written out."""

from __future__ import annotations

import pytest

from edgeport_xnnpack._memo import BoundedMemo


def test_drops_the_least_recently_used_entry_past_its_count():
    memo = BoundedMemo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # "a" is now the most recently used
    memo.put("c", 3)
    assert list(memo) == ["a", "c"] and memo.get("b") is None and len(memo) == 2


def test_keeps_the_first_value_of_a_key_and_returns_it():
    memo = BoundedMemo(4)
    assert memo.put("k", 1) == 1
    assert memo.put("k", 2) == 1 and memo.get("k") == 1


def test_byte_bound_drops_oldest_until_it_fits():
    memo = BoundedMemo(10, max_bytes=10, size=len)
    memo.put(1, b"xxxx")
    memo.put(2, b"yyyy")
    memo.put(3, b"zzzz")  # 12 bytes > 10: the oldest goes
    assert list(memo) == [2, 3]
    memo.clear()
    memo.put(4, b"x" * 10)
    assert list(memo) == [4]  # the count of bytes restarted at the clear


def test_default_and_unhashable_keys():
    memo = BoundedMemo(1)
    sentinel = object()
    assert memo.get("missing", sentinel) is sentinel
    with pytest.raises(TypeError):
        memo.get(["not", "hashable"])
