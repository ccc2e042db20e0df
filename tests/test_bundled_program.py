"""Bundled programs (``.bpte``) both ways: the stock ExecuTorch runtime verifies edgeport's bundles (in a child
process, so a crash fails the test), edgeport's runtime verifies ExecuTorch's; a wrong expected output, bad test
cases and damaged files are refused clearly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from edgeport import EdgeportError, ProgramError, SerializationError, to_edge, to_edge_transform_and_lower
from edgeport.devtools import (
    BundledProgram,
    BundledVerificationError,
    MethodTestCase,
    MethodTestSuite,
    load_bundled_program,
)
from edgeport.testing.models import cnn_bn_pool, two_linear

MODELS = {"two_linear": two_linear, "cnn_bn_pool": cnn_bn_pool}

_STOCK_VERIFY = r"""
import sys
from executorch.extension.pybindings.portable_lib import _load_bundled_program_from_buffer
bundle = _load_bundled_program_from_buffer(open(sys.argv[1], "rb").read())
for case in range(int(sys.argv[2])):
    bundle.verify_result_with_bundled_expected_output("forward", case, 1e-4, 1e-5)
print("verified")
"""


def _bundle(name: str, path: str, shift: float = 0.0) -> tuple[BundledProgram, int]:
    model, example = MODELS[name]()
    model.eval()
    ep = torch.export.export(model, example)
    if path == "portable":
        manager = to_edge(ep).to_executorch()
    else:
        from edgeport_xnnpack import XnnpackPartitioner

        manager = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    torch.manual_seed(1)
    inputs = [example[0], torch.randn_like(example[0])]
    with torch.no_grad():
        cases = [MethodTestCase([x], [model(x) + shift]) for x in inputs]
    return BundledProgram(manager, [MethodTestSuite("forward", cases)]), len(cases)


@pytest.mark.parametrize("path", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_runtime_verifies_edgeport_bundles(name, path):
    bundle, n = _bundle(name, path)
    report = load_bundled_program(bundle.buffer).verify(rtol=1e-4, atol=1e-5)
    assert len(report["forward"]) == n and max(report["forward"]) < 1e-4


@pytest.mark.executorch
@pytest.mark.parametrize("path", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", [pytest.param("cnn_bn_pool", marks=pytest.mark.slow), "two_linear"])
def test_stock_runtime_verifies_edgeport_bundles(name, path, tmp_path):
    pytest.importorskip("executorch")
    good, n = _bundle(name, path)
    wrong, _ = _bundle(name, path, shift=1.0)
    for bundle, should_pass in ((good, True), (wrong, False)):
        file = tmp_path / f"{name}-{path}-{should_pass}.bpte"
        bundle.save(str(file))
        done = subprocess.run([sys.executable, "-c", _STOCK_VERIFY, str(file), str(n)], capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode >= 0, f"the stock runtime crashed (signal {-done.returncode}):\n{done.stderr[-2000:]}"
        if should_pass:
            assert done.returncode == 0 and "verified" in done.stdout, done.stderr[-2000:]
        else:
            assert done.returncode != 0, "the stock runtime accepted a wrong expected output"


@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_runtime_verifies_executorch_bundles(name):
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.devtools.bundled_program.config import MethodTestCase as EtCase
    from executorch.devtools.bundled_program.config import MethodTestSuite as EtSuite
    from executorch.devtools.bundled_program.core import BundledProgram as EtBundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge_transform_and_lower as et_lower

    model, example = MODELS[name]()
    model.eval()
    manager = et_lower(torch.export.export(model, example), partitioner=[EtXnnpack()]).to_executorch()
    with torch.no_grad():
        cases = [EtCase(inputs=[example[0]], expected_outputs=[model(example[0])])]
    data = serialize_from_bundled_program_to_flatbuffer(EtBundledProgram(manager, [EtSuite("forward", cases)]))
    loaded = load_bundled_program(data, "executorch.bpte")
    assert loaded.version == 2 and loaded.program == manager.buffer
    np.testing.assert_array_equal(loaded.suites["forward"][0][0][0], example[0].numpy())
    assert max(loaded.verify(rtol=1e-4, atol=1e-5)["forward"]) < 1e-4


def test_a_wrong_expected_output_names_the_case():
    bundle, _ = _bundle("two_linear", "portable", shift=0.5)
    with pytest.raises(BundledVerificationError, match=r"method 'forward' test case 0 output 0: max \|got - "):
        load_bundled_program(bundle.buffer).verify()


@pytest.mark.parametrize("suite, message", [
    (MethodTestSuite("backward", []), r"no such method \(methods: \['forward'\]\)"),
    (MethodTestSuite("forward", [MethodTestCase([])]), r"0 inputs, the method takes 1"),
    (MethodTestSuite("forward", [MethodTestCase([torch.zeros(3, 3)])]), r"shape \[3, 3\], the method takes"),
    (MethodTestSuite("forward", [MethodTestCase([torch.zeros(2, 16, dtype=torch.int64)])]), r"dtype LONG"),
    (MethodTestSuite("forward", [MethodTestCase(["x"])]), r"str is not a tensor"),
])
def test_bad_test_cases_are_refused_when_bundling(suite, message):
    model, example = two_linear()
    manager = to_edge(torch.export.export(model.eval(), example)).to_executorch()
    with pytest.raises(SerializationError, match=message):
        BundledProgram(manager, [suite])


def test_damaged_bundles_never_crash():
    bundle, _ = _bundle("two_linear", "portable")
    data = bundle.buffer
    with pytest.raises(ProgramError, match=r"not a \.bpte"):
        load_bundled_program(b"\x00" * 16, "x.bpte")
    for cut in (8, 40, len(data) // 2, len(data) - 1):
        with pytest.raises(ProgramError, match=r"bundled program"):
            load_bundled_program(data[:cut])
    rng = np.random.default_rng(0)
    for _ in range(200):
        bad = bytearray(data)
        for pos in rng.integers(0, len(bad), size=3):
            bad[pos] ^= int(rng.integers(1, 256))
        try:  # flips land in the bundle's tables, its test data or the program inside it
            load_bundled_program(bytes(bad)).verify()
        except EdgeportError:  # ProgramError, BundledVerificationError, the runtime's own errors
            pass
