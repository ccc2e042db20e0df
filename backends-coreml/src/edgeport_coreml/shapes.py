"""Enumerated input shapes of ``CoreMLBackend`` (compile spec ``enumerated_shapes``, ExecuTorch's key and JSON).

A program exported with a dynamic dimension (``torch.export.Dim``) converts by default with Core ML's *range*
shape: coremltools reads the dimension's bounds from the export (``Dim("batch", min=1, max=64)`` becomes a
``shapeRange`` 1..64 in the model's input description). The ``enumerated_shapes`` compile spec instead lists the
shapes a model will see (``ct.EnumeratedShapes``), which Core ML can specialise for (the Neural Engine runs
enumerated shapes, not ranges).

The value is what ExecuTorch 1.5.1's ``CoreMLBackend.generate_enumerated_shapes_compile_spec`` writes: a JSON list
of ``[{"shape": [dim, ...]}, [[[...], ...], [names]]]`` pairs, one per distinct symbolic input shape, where ``dim`` is
an int or ``{"key_name": "s77", "low": 1, "high": 64}`` (the export's symbol and its range), followed by the
enumerated concrete shapes and the names of the program inputs that have that shape. Keyed by symbolic shape rather than input name, so the spec applies to every partition's inputs.
Enumerations of different inputs are tied by position; more than one enumerated input needs iOS18.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from edgeport.backend import CompileSpec

__all__ = ["ENUMERATED_SHAPES_KEY", "EnumeratedShapes", "decode_enumerated_shapes",
           "generate_enumerated_shapes_compile_spec", "symbolic_shape"]

ENUMERATED_SHAPES_KEY = "enumerated_shapes"
#: one symbolic shape: ints and symbol names (``"s77"``)
ShapeKey = tuple[int | str, ...]
#: symbolic shape -> (its dims as written, the enumerated shapes, the input names)
EnumeratedShapes = dict[ShapeKey, tuple[list[Any], list[list[int]], list[str]]]


def _symbol_name(s: Any) -> str:
    text = str(s)
    return text[4:-1] if text.startswith("Sym(") and text.endswith(")") else text


def _bound(b: Any) -> int | None:
    if b is None or str(b) in {"int_oo", "-int_oo", "oo", "-oo"}:
        return None
    return int(str(b))


def symbolic_shape(shape: Sequence[Any], range_constraints: Mapping[Any, Any] | None = None) -> list[Any]:
    """A (fake) tensor's shape as the spec writes it: ints, and ``{"key_name", "low", "high"}`` per symbol."""
    out: list[Any] = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
            continue
        name, low, high = _symbol_name(d), None, None
        for k, v in (range_constraints or {}).items():
            if _symbol_name(k) == name:
                low, high = _bound(getattr(v, "lower", None)), _bound(getattr(v, "upper", None))
        out.append({"key_name": name, "low": low, "high": high})
    return out


def _key(dims: Sequence[Any]) -> ShapeKey:
    return tuple(d if isinstance(d, int) else str(d["key_name"]) for d in dims)


def _check_enumeration(where: str, dims: list[Any], shapes: Any) -> list[list[int]]:
    if not isinstance(shapes, list) or len(shapes) < 2:
        raise ValueError(f"enumerated_shapes: {where} needs a list of at least two shapes, got {shapes!r}")
    out = []
    for shape in shapes:
        if not isinstance(shape, list) or len(shape) != len(dims) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape):
            raise ValueError(f"enumerated_shapes: {where}: {shape!r} is not a list of {len(dims)} positive ints")
        for i, (d, v) in enumerate(zip(dims, shape)):
            if isinstance(d, int):
                if d != v:
                    raise ValueError(f"enumerated_shapes: {where}: {shape} differs from the static size {d} at "
                                     f"dimension {i}")
                continue
            low, high = d.get("low"), d.get("high")
            # torch.export specialises 0/1, so a Dim declared with min=1 reports a lower bound of 2
            if (low is not None and v < low and not (v == 1 and low == 2)) or (high is not None and v > high):
                raise ValueError(f"enumerated_shapes: {where}: {shape} puts {v} at dimension {i}, outside the "
                                 f"exported range [{low}, {high}] of {d['key_name']}")
        out.append(list(shape))
    return out


def decode_enumerated_shapes(value: bytes) -> EnumeratedShapes:
    """Parse and check the compile spec's JSON."""
    try:
        items = json.loads(bytes(value).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"compile spec 'enumerated_shapes' is not JSON in UTF-8: {exc}") from None
    if not isinstance(items, list) or not items:
        raise ValueError("enumerated_shapes must be a non-empty JSON list of [{\"shape\": [...]}, [[shapes], "
                         "[names]]] pairs")
    out: EnumeratedShapes = {}
    counts = set()
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], dict)
                and isinstance(item[0].get("shape"), list) and isinstance(item[1], list) and len(item[1]) == 2
                and isinstance(item[1][1], list) and all(isinstance(n, str) for n in item[1][1])):
            raise ValueError(f"enumerated_shapes: entry {item!r} is not a [{{\"shape\": [...]}}, [[shapes], "
                             "[names]]] pair")
        dims = item[0]["shape"]
        for d in dims:
            if not isinstance(d, int) and not (isinstance(d, dict) and isinstance(d.get("key_name"), str)):
                raise ValueError(f"enumerated_shapes: dimension {d!r} is neither an int nor a symbol")
        shapes = _check_enumeration(f"symbolic shape {_key(dims)}", dims, item[1][0])
        counts.add(len(shapes))
        out[_key(dims)] = (dims, shapes, list(item[1][1]))
    if len(counts) > 1:
        raise ValueError(f"enumerated_shapes: every input needs the same number of shapes (they are tied by "
                         f"position), got {sorted(counts)}")
    return out


def encode_enumerated_shapes(shapes: EnumeratedShapes) -> bytes:
    return json.dumps([[{"shape": dims}, [enumerations, names]] for dims, enumerations, names in shapes.values()]
                      ).encode("utf-8")


def generate_enumerated_shapes_compile_spec(ep: Any, enumerated_shapes: Mapping[str, Sequence[Sequence[int]]]
                                            ) -> CompileSpec:
    """The ``enumerated_shapes`` compile spec for ``ep`` (an ``ExportedProgram`` with dynamic inputs).

    ``enumerated_shapes`` maps each dynamic user input's name to its shapes, e.g. ``{"x": [[1, 32], [8, 32]]}``
    (ExecuTorch's ``generate_enumerated_shapes_compile_spec``). Static inputs need no entry.
    """
    user_inputs = set(ep.graph_signature.user_inputs)
    out: EnumeratedShapes = {}
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        dims = symbolic_shape(node.meta["val"].shape, ep.range_constraints)
        if all(isinstance(d, int) for d in dims):
            continue
        if node.name not in enumerated_shapes:
            raise ValueError(f"input {node.name!r} has a dynamic shape {_key(dims)}, but enumerated_shapes gives "
                             f"no shapes for it (given: {sorted(enumerated_shapes)})")
        shapes = _check_enumeration(f"input {node.name!r}", dims, [list(s) for s in enumerated_shapes[node.name]])
        key = _key(dims)
        if key in out:
            if out[key][1] != shapes:
                raise ValueError(f"inputs share the symbolic shape {key} but are given different enumerations; "
                                 "export them with different Dims")
            out[key][2].append(node.name)
        else:
            out[key] = (dims, shapes, [node.name])
    unknown = set(enumerated_shapes) - {n.name for n in ep.graph.nodes if n.op == "placeholder"}
    if unknown:
        raise ValueError(f"enumerated_shapes names {sorted(unknown)}, which are not inputs of the program")
    if not out:
        raise ValueError("the program has no dynamic input: enumerated shapes need a torch.export Dim")
    counts = {len(v[1]) for v in out.values()}
    if len(counts) > 1:
        raise ValueError(f"every dynamic input needs the same number of shapes (tied by position), got "
                         f"{sorted(counts)}")
    return CompileSpec(ENUMERATED_SHAPES_KEY, encode_enumerated_shapes(out))
