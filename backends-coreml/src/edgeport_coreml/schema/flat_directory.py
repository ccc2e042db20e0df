"""ExecuTorch's Core ML delegate blob: a directory tree flattened into one byte string (edgeport's own code).

Layout, as ExecuTorch 1.5.1's ``inmemoryfs`` writes it (``executorchcoreml.flatten_directory_contents``) and its
Core ML runtime reads it:

* the file contents, one after the other, each starting at a multiple of ``alignment`` (1 for blobs under 1 GiB,
  the page size above), zero-filled between (so the metadata follows the last file within one alignment unit:
  the reader checks that, which also refuses a whole program or other bytes ending in a blob);
* the *metadata*: compact JSON, written **reversed** byte for byte, starting at the next multiple of
  ``alignment`` after the last file and ending the blob. Unreversed it reads::

      {"nodes": [{"children": {}, "dataRegion": {"offset": 0, "size": 5}, "kind": 0, "name": "a.txt"}, ...,
                 {"children": {"a.txt": 0, ...}, "dataRegion": {"offset": 0, "size": 0}, "kind": 1,
                  "name": "lowered_module"}]}

  ``kind`` 0 is a file (its bytes are ``dataRegion`` of the blob), 1 a directory (``children`` maps each entry's
  name to its index in ``nodes``). Children come before their directory (post-order); the last node is the root,
  whose name is the directory unflattening creates (``lowered_module`` in ExecuTorch's blobs).

A reader finds the metadata by scanning back from the end: the reversed text is a JSON object, so reading the blob
backwards from its last byte (``{``) to the matching ``}`` delimits it. :func:`read_flat_directory` checks every
node (names are single path components, indices point backwards, each node has one parent, regions lie in the data
area) before anything is written to disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FlatDirectory", "FlatDirectoryError", "flatten_directory", "flatten_tree", "read_flat_directory",
           "unflatten_to"]

_FILE, _DIR = 0, 1
_MAX_METADATA = 64 << 20
_MAX_ALIGNMENT = 1 << 16  # ExecuTorch aligns to 1 byte, or to the page size above 1 GiB


class FlatDirectoryError(ValueError):
    """The bytes are not a flattened directory (ExecuTorch's Core ML delegate format), or a damaged one."""


@dataclass
class FlatDirectory:
    """A parsed blob: the root's name and ``files``: relative POSIX path -> memoryview of the contents.

    ``directories`` lists every directory's relative path (``""`` is the root), empty ones included.
    """

    root_name: str
    files: dict[str, memoryview] = field(default_factory=dict)
    directories: list[str] = field(default_factory=list)
    metadata_bytes: int = 0

    def read(self, path: str) -> bytes:
        try:
            return bytes(self.files[path])
        except KeyError:
            raise FlatDirectoryError(f"the blob has no file {path!r}; it holds {sorted(self.files)}") from None

    def subtree(self, prefix: str) -> dict[str, memoryview]:
        p = prefix.rstrip("/") + "/"
        return {k[len(p):]: v for k, v in self.files.items() if k.startswith(p)}


# -- writing ----------------------------------------------------------------------------------------------------
def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def flatten_tree(root_name: str, tree: Mapping[str, object], alignment: int = 1) -> bytes:
    """Flatten a nested mapping (name -> ``bytes`` for a file, or another mapping for a directory).

    Entries are written in sorted name order, so equal trees give equal bytes (ExecuTorch's writer follows an
    ``unordered_map``'s order instead; readers do not depend on the order).
    """
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    nodes: list[dict[str, object]] = []
    chunks: list[bytes] = []
    pos = 0

    def visit(name: str, item: object) -> int:
        nonlocal pos
        _check_name(name, allow_root=item is tree)
        if isinstance(item, Mapping):
            children = {key: visit(key, sub) for key, sub in sorted(item.items())}
            nodes.append({"children": children, "dataRegion": {"offset": 0, "size": 0}, "kind": _DIR,
                          "name": name})
        else:
            data = bytes(item)  # type: ignore[call-overload]
            offset = _align(pos, alignment)
            chunks.append(b"\0" * (offset - pos))
            chunks.append(data)
            pos = offset + len(data)
            nodes.append({"children": {}, "dataRegion": {"offset": offset, "size": len(data)}, "kind": _FILE,
                          "name": name})
        return len(nodes) - 1

    visit(root_name, tree)
    meta_at = _align(pos, alignment)
    chunks.append(b"\0" * (meta_at - pos))
    text = json.dumps({"nodes": nodes}, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    chunks.append(text.encode("utf-8")[::-1])
    return b"".join(chunks)


def flatten_directory(path: str | os.PathLike[str], alignment: int = 1) -> bytes:
    """Flatten the directory at ``path`` (its name becomes the root's name); symlinks are refused."""
    root = Path(path)
    if not root.is_dir():
        raise FlatDirectoryError(f"{root} is not a directory")

    def load(p: Path) -> dict[str, object]:
        out: dict[str, object] = {}
        for entry in sorted(p.iterdir()):
            if entry.is_symlink():
                raise FlatDirectoryError(f"{entry} is a symbolic link; a flattened directory holds only files")
            out[entry.name] = load(entry) if entry.is_dir() else entry.read_bytes()
        return out

    return flatten_tree(root.name, load(root), alignment)


# -- reading ----------------------------------------------------------------------------------------------------
def _check_name(name: object, allow_root: bool = False) -> None:
    if not isinstance(name, str) or (not name and not allow_root) or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name:
        raise FlatDirectoryError(f"invalid entry name {name!r}: names must be single path components")


def _metadata_start(buf: memoryview) -> int:
    """Index where the reversed metadata JSON starts (it ends the blob)."""
    n = len(buf)
    if n == 0:
        raise FlatDirectoryError("empty blob: not a flattened directory (ExecuTorch's Core ML delegate format)")
    if buf[n - 1] != ord("{"):
        raise FlatDirectoryError("not a flattened directory (ExecuTorch's Core ML delegate format): the blob does "
                                 f"not end with reversed JSON metadata (last byte 0x{buf[n - 1]:02x})")
    depth, in_string, escaped = 0, False, False
    for k in range(min(n, _MAX_METADATA)):  # the reversed text read forwards is ordinary JSON
        c = buf[n - 1 - k]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
            if depth == 0:
                return n - 1 - k
    raise FlatDirectoryError("truncated or damaged blob: the reversed JSON metadata at its end never closes")


def read_flat_directory(data: bytes | bytearray | memoryview) -> FlatDirectory:
    """Parse and check a flattened directory; the files are views into ``data`` (no copy)."""
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    start = _metadata_start(buf)
    try:
        meta = json.loads(bytes(buf[start:])[::-1].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FlatDirectoryError(f"damaged blob: its metadata is not JSON ({exc})") from None
    nodes = meta.get("nodes") if isinstance(meta, dict) else None
    if not isinstance(nodes, list) or not nodes:
        raise FlatDirectoryError("damaged blob: the metadata lists no nodes")
    parent: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise FlatDirectoryError(f"damaged blob: node {i} is not an object")
        kind, name = node.get("kind"), node.get("name")
        _check_name(name, allow_root=i == len(nodes) - 1)
        region = node.get("dataRegion", {"offset": 0, "size": 0})
        offset, size = (region.get("offset"), region.get("size")) if isinstance(region, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, size)):
            raise FlatDirectoryError(f"damaged blob: node {i} ({name!r}) has an invalid data region {region!r}")
        children = node.get("children", {})
        if not isinstance(children, dict):
            raise FlatDirectoryError(f"damaged blob: node {i} ({name!r}) has invalid children")
        if kind == _FILE:
            if children:
                raise FlatDirectoryError(f"damaged blob: file node {i} ({name!r}) has children")
            if offset + size > start:
                raise FlatDirectoryError(f"damaged blob: file {name!r} ({size} bytes at {offset}) lies outside the "
                                         f"data area ({start} bytes)")
        elif kind == _DIR:
            for child_name, index in children.items():
                _check_name(child_name)
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < i:
                    raise FlatDirectoryError(f"damaged blob: directory {name!r} names child {child_name!r} at "
                                             f"index {index!r}, which does not precede it")
                if index in parent:
                    raise FlatDirectoryError(f"damaged blob: node {index} belongs to two directories")
                if nodes[index].get("name") != child_name:
                    raise FlatDirectoryError(f"damaged blob: directory {name!r} calls node {index} {child_name!r}, "
                                             f"but the node is named {nodes[index].get('name')!r}")
                parent[index] = i
        else:
            raise FlatDirectoryError(f"damaged blob: node {i} ({name!r}) has unknown kind {kind!r}")
    root = len(nodes) - 1
    if nodes[root].get("kind") != _DIR:
        raise FlatDirectoryError("damaged blob: the root node is not a directory")
    data_end = max((n["dataRegion"]["offset"] + n["dataRegion"]["size"] for n in nodes if n["kind"] == _FILE),
                   default=0)
    gap = start - data_end
    if gap >= _MAX_ALIGNMENT or any(buf[data_end:start]):
        raise FlatDirectoryError(f"damaged blob: the files end at byte {data_end} but the metadata starts at byte "
                                 f"{start}, with {gap} bytes between that are not alignment padding (is this a whole "
                                 "program? a delegate blob starts with its first file)")
    orphans = [i for i in range(root) if i not in parent]
    if orphans:
        raise FlatDirectoryError(f"damaged blob: nodes {orphans[:5]} belong to no directory")
    out = FlatDirectory(root_name=nodes[root]["name"], metadata_bytes=len(buf) - start)

    def walk(i: int, path: str) -> None:
        node = nodes[i]
        if node["kind"] == _FILE:
            r = node.get("dataRegion", {"offset": 0, "size": 0})
            out.files[path] = buf[r["offset"]:r["offset"] + r["size"]]
            return
        out.directories.append(path)
        for child_name, index in sorted(node.get("children", {}).items()):
            walk(index, f"{path}/{child_name}" if path else child_name)

    walk(root, "")
    return out


def unflatten_to(data: bytes | bytearray | memoryview | FlatDirectory, destination: str | os.PathLike[str]
                 ) -> Path:
    """Write the tree under ``destination`` (which must exist) as ``destination/<root name>``; returns that path.

    Same result as ExecuTorch's ``unflatten_directory_contents``; the blob is fully checked first.
    """
    flat = data if isinstance(data, FlatDirectory) else read_flat_directory(data)
    dest = Path(destination)
    if not dest.is_dir():
        raise FlatDirectoryError(f"destination {dest} is not an existing directory")
    root = dest / flat.root_name if flat.root_name else dest
    for d in flat.directories:
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, content in flat.files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return root
