"""Real architectures in int8 on XNNPACK: every architecture of ``edgeport.testing.architectures`` (Hugging Face
models from small configs, random weights) quantized with ``XnnpackQuantizer`` (pt2e, calibrated as every backend's
suite is: :func:`edgeport.testing.int8_suite.pt2e_convert`), lowered with ``XnnpackPartitioner`` and run on
edgeport's runtime and on the stock ExecuTorch runtime (a child process).

Oracle: the pt2e-converted model. The program's SQNR against fp32 eager must be within 1 dB of the converted
model's own (the suite's done-when), on edgeport's runtime and on the stock runtime. ``bench/xnnpack_int8_architectures.py`` prints the table with ExecuTorch's quantizer and
partitioner on the same export. ResNet and BERT in the default run, the rest with ``-m slow``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, eager_outputs
from edgeport.testing.int8_suite import delegated_ops, pt2e_convert, sqnr_db

pytest.importorskip("transformers")
pytest.importorskip("edgeport_xnnpack")

DEFAULT = ("bert", "resnet")


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ARCHITECTURES)])
def test_int8_on_xnnpack_is_within_1_db_of_its_pt2e_model(name):
    from edgeport.testing.conformance.stock_checks import stock_runtime_missing
    from edgeport.testing.stock_runtime import run_program
    from edgeport_xnnpack import XnnpackPartitioner, XnnpackQuantizer

    arch = ARCHITECTURES[name]()
    inputs = tuple(arch.example_inputs)
    converted = pt2e_convert(arch, XnnpackQuantizer())
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    edge = to_edge_transform_and_lower(torch.export.export(converted, inputs), partitioner=[XnnpackPartitioner()])
    inside, total = delegated_ops(edge)
    assert inside > 0, f"{name}: nothing delegated"
    buffer = edge.to_executorch().buffer
    got = np.asarray(Runtime.get().load_program(buffer).load_method("forward").execute(
        [t.numpy() for t in inputs])[0])
    eager = eager_outputs(arch)
    ours, theirs = sqnr_db(got, eager), sqnr_db(oracle, eager)
    assert ours >= theirs - 1.0, f"{name}: XNNPACK {ours:.1f} dB vs eager; its pt2e model {theirs:.1f} dB " \
                                 f"(XNNPACK vs pt2e {sqnr_db(got, oracle):.1f} dB)"
    if stock_runtime_missing():
        return
    result = run_program(buffer, list(inputs))
    assert result.ok, result.error or result.crash
    stock = np.asarray(result.outputs[0])
    assert sqnr_db(stock, eager) >= theirs - 1.0, f"{name}: stock runtime {sqnr_db(stock, eager):.1f} dB vs eager"
