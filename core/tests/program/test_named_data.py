"""The named data store: unique keys, content-addressed sharing, clear errors, and its place in the program."""

from __future__ import annotations

import pytest

from edgeport.errors import SerializationError
from edgeport.named_data import NamedDataStore, NamedDataStoreOutput, content_key, merge_named_data
from edgeport.program import load_pte, serialize_pte
from edgeport.program import schema as S


def test_same_key_same_bytes_is_stored_once_and_keeps_the_larger_alignment():
    store = NamedDataStore()
    store.add_named_data("w", b"abcd", alignment=16)
    store.add_named_data("w", bytearray(b"abcd"), alignment=64)
    out = store.output()
    assert list(out.entries) == ["w"] and out.entries["w"].data == b"abcd" and out.entries["w"].alignment == 64


def test_same_key_different_bytes_is_refused_with_what_to_do():
    store = NamedDataStore()
    store.add_named_data("w", b"abcd")
    with pytest.raises(SerializationError, match="different bytes.*content_key"):
        store.add_named_data("w", b"abce")


@pytest.mark.parametrize("alignment", [0, 3, -16, 1.5])
def test_bad_alignment_is_refused(alignment):
    with pytest.raises(SerializationError, match="power of two"):
        NamedDataStore().add_named_data("w", b"x", alignment=alignment)


def test_content_key_is_sha256():
    import hashlib

    assert content_key(b"xyz") == hashlib.sha256(b"xyz").hexdigest()
    store = NamedDataStore()
    assert store.add_content(b"xyz") == content_key(b"xyz")


def test_merge_shares_identical_weights_and_names_both_owners_on_conflict():
    a, b = NamedDataStore(), NamedDataStore()
    a.add_named_data("shared", b"1234", 16)
    b.add_named_data("shared", b"1234", 32)
    b.add_named_data("only_b", b"zz")
    merged = merge_named_data([("delegate 0", a.output()), ("delegate 1", b.output()), ("delegate 2", None)])
    assert merged == {"shared": (b"1234", 32), "only_b": (b"zz", 16)}
    c = NamedDataStore()
    c.add_named_data("shared", b"4321")
    with pytest.raises(SerializationError, match="delegate 0.*delegate 2"):
        merge_named_data([("delegate 0", a.output()), ("delegate 2", c.output())])
    with pytest.raises(SerializationError, match="NamedDataStoreOutput"):
        merge_named_data([("delegate 0", {"k": b"v"})])


def test_named_data_segments_are_aligned_and_read_back():
    program = S.Program(version=0, execution_plan=[], constant_buffer=[S.Buffer(b"")], backend_delegate_data=[],
                        segments=[], constant_segment=S.SubsegmentOffsets(0, []))
    data = {"a": (b"\x01" * 5, 16), "b": (b"\x02" * 40, 64), "a2": (b"\x01" * 5, 16)}
    pte = serialize_pte(program, named_data=data)
    lp = load_pte(pte)
    assert bytes(lp.named_data("a")) == b"\x01" * 5 and bytes(lp.named_data("b")) == b"\x02" * 40
    index = {nd.key: nd.segment_index for nd in lp.program.named_data}
    assert index["a"] == index["a2"]  # identical bytes share one segment
    assert lp.program.segments[index["b"]].offset % 64 == 0
    assert isinstance(NamedDataStore().output(), NamedDataStoreOutput)
