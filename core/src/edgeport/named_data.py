"""The named data store: how backends hand weights to the program writer (ExecuTorch's ``NamedDataStore``).

A backend's ``preprocess`` adds bytes under a key (``add_named_data``) and returns
``PreprocessResult(..., data_store_output=store.output())``. The writer gathers the stores of every delegate of
every method into ``Program.named_data``: one segment per distinct content, so a weight used by several
partitions, methods or backends is stored once; at run time the executor gets a ``key -> bytes`` lookup
(``init(..., named_data=...)``; the stock ExecuTorch runtime passes its ``NamedDataMap``).

Why this matters: ExecuTorch's runtime frees a delegate's blob after ``init`` (on a device the blob is memory-mapped
and unmapped), so anything a backend library keeps a pointer to after init must live in named data, not in the blob.

Keys must be unique: the same key with different bytes is an error. :func:`content_key` gives the key ExecuTorch's
XNNPACK delegate uses (the SHA-256 of the bytes), which makes identical weights share one entry. Torch-free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from edgeport.errors import SerializationError

DEFAULT_NAMED_DATA_ALIGNMENT = 16


def content_key(data: bytes | bytearray | memoryview) -> str:
    """The content-addressed key of ``data``: its SHA-256, as 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


def _check_alignment(key: str, alignment: int) -> None:
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise SerializationError(f"named data {key!r}: alignment must be a positive power of two, got {alignment!r}")


@dataclass(frozen=True)
class NamedDataEntry:
    """The bytes stored under one key, and the alignment their segment needs."""

    data: bytes
    alignment: int = DEFAULT_NAMED_DATA_ALIGNMENT
    external_tag: str | None = None  # None: in the .pte; else the .ptd file (tag) it is written to


@dataclass
class NamedDataStoreOutput:
    """What ``preprocess`` returns in ``PreprocessResult.data_store_output``: ``key -> NamedDataEntry``."""

    entries: dict[str, NamedDataEntry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)


class NamedDataStore:
    """Collects a backend's named data during ``preprocess``; ``output()`` is what it returns to the writer."""

    def __init__(self) -> None:
        self._entries: dict[str, NamedDataEntry] = {}

    def add_named_data(self, key: str, data: bytes | bytearray | memoryview,
                       alignment: int = DEFAULT_NAMED_DATA_ALIGNMENT, external_tag: str | None = None) -> str:
        """Store ``data`` under ``key``; adding the same bytes again is a no-op (the larger alignment wins).

        ``external_tag`` (ExecuTorch's name) writes the entry to the ``<external_tag>.ptd`` data file instead of
        the program (``ExecutorchProgramManager.write_tensor_data_to_file``).

        Raises :class:`~edgeport.errors.SerializationError` when ``key`` already holds different bytes.
        Returns ``key``.
        """
        if not isinstance(key, str) or not key:
            raise SerializationError(f"named data key must be a non-empty str, got {key!r}")
        _check_alignment(key, alignment)
        if external_tag is not None and (not isinstance(external_tag, str) or not external_tag):
            raise SerializationError(f"named data {key!r}: external_tag must be a non-empty str or None, "
                                     f"got {external_tag!r}")
        content = bytes(data)
        old = self._entries.get(key)
        if old is not None:
            if old.data != content:
                raise SerializationError(
                    f"named data {key!r} is already stored with different bytes ({len(old.data)} vs {len(content)}); "
                    "use a unique key per weight, e.g. edgeport.named_data.content_key(data)")
            if old.external_tag != external_tag:
                raise SerializationError(f"named data {key!r} is added with external_tag {old.external_tag!r} "
                                         f"and {external_tag!r}; one key lives in one file")
            alignment = max(alignment, old.alignment)
        self._entries[key] = NamedDataEntry(content, alignment, external_tag)
        return key

    def add_content(self, data: bytes | bytearray | memoryview,
                    alignment: int = DEFAULT_NAMED_DATA_ALIGNMENT, external_tag: str | None = None) -> str:
        """Store ``data`` under its :func:`content_key`; returns the key."""
        return self.add_named_data(content_key(data), data, alignment, external_tag)

    def output(self) -> NamedDataStoreOutput:
        return NamedDataStoreOutput(dict(self._entries))


def merge_named_data(outputs: Iterable[tuple[str, NamedDataStoreOutput | None]]) -> dict[str, tuple[bytes, int]]:
    """Merge the stores of several delegates (``(who, output)`` pairs) into ``key -> (bytes, alignment)``: the
    entries that live in the program (no external tag); see :func:`merge_named_data_by_tag` for all.

    The same key with the same bytes is stored once; the same key with different bytes raises
    :class:`~edgeport.errors.SerializationError` naming both delegates.
    """
    return merge_named_data_by_tag(outputs).get(None, {})


def merge_named_data_by_tag(outputs: Iterable[tuple[str, NamedDataStoreOutput | None]]
                            ) -> dict[str | None, dict[str, tuple[bytes, int]]]:
    """Like :func:`merge_named_data`, grouped by external tag (``None``: the program itself)."""
    merged: dict[str | None, dict[str, tuple[bytes, int]]] = {}
    owner: dict[str, tuple[str, str | None, bytes]] = {}
    for who, output in outputs:
        if output is None:
            continue
        if not isinstance(output, NamedDataStoreOutput):
            raise SerializationError(
                f"{who}: data_store_output must be a NamedDataStoreOutput (NamedDataStore().output()), "
                f"got {type(output).__name__}")
        for key, entry in output.entries.items():
            first = owner.get(key)
            if first is not None and first[2] != entry.data:
                raise SerializationError(
                    f"named data {key!r} is stored by {first[0]} and by {who} with different bytes; "
                    "backends must use unique keys (e.g. edgeport.named_data.content_key)")
            group = merged.setdefault(entry.external_tag, {})
            old = group.get(key)
            group[key] = (entry.data, max(entry.alignment, old[1]) if old else entry.alignment)
            owner.setdefault(key, (who, entry.external_tag, entry.data))
    return merged
