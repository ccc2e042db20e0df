"""A bounded, thread-safe least-recently-used memo: the planning caches shared by delegates of one structure
(``_plan`` layouts, ``_copies`` tables) keep what they derived in one."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

__all__ = ["BoundedMemo"]


class BoundedMemo:
    """At most ``entries`` values, and at most ``max_bytes`` of their ``size(value)`` (when given); the least
    recently used are dropped first. A key that cannot be hashed raises ``TypeError``."""

    def __init__(self, entries: int, max_bytes: int | None = None,
                 size: Callable[[Any], int] = lambda value: 0) -> None:
        self.entries, self.max_bytes, self.size = entries, max_bytes, size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value kept under ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            if key not in self._items:
                return default
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep ``value`` under ``key`` and return it; a key already kept keeps (and returns) its first value."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            self._items[key] = value
            self._bytes += self.size(value)
            while len(self._items) > self.entries or (self.max_bytes is not None and self._bytes > self.max_bytes):
                self._bytes -= self.size(self._items.popitem(last=False)[1])
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __iter__(self) -> Iterator[Hashable]:
        with self._lock:
            return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)
