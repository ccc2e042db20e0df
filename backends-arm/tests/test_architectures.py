"""Real architectures in int8 on Ethos-U: every architecture of ``edgeport.testing.architectures`` (Hugging Face
models from small configs, random weights) quantized with ``EthosUQuantizer``, lowered with ``EthosUPartitioner``
(Vela in its isolated worker; what the NPU cannot run stays on the CPU) and run on edgeport's runtime (Arm's TOSA
reference model executes the delegates).

Oracle: the pt2e-converted model (4 random calibration batches, then the example). The program's SQNR against fp32
eager must be within 1 dB of the converted model's own SQNR against eager; the share of compute ops inside Ethos-U
delegates must not drop below what ``bench/arm_architectures.py`` measured (which also prints ExecuTorch's
partitioner's share on the same export). ResNet in the default run, the rest with ``-m slow``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, eager_outputs
from edgeport.testing.int8_suite import delegated_ops, pt2e_convert, sqnr_db
from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer

pytest.importorskip("transformers")

TARGET = "ethos-u55-128"
DEFAULT = ("resnet",)
# share of compute ops (quantize / dequantize not counted) inside Ethos-U delegates, measured 2026-11-28
# (bench/arm_architectures.py, U55-128); a drop below it is a regression
FLOORS = {"bert": 0.99, "distilbert": 0.99, "gpt2": 0.96, "llama": 0.99, "qwen2": 0.99, "vit": 1.0}


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ARCHITECTURES)])
def test_int8_on_ethos_u_is_within_1_db_of_its_pt2e_model(name):
    arch = ARCHITECTURES[name]()
    inputs = tuple(arch.example_inputs)
    spec = EthosUCompileSpec(TARGET)
    converted = pt2e_convert(arch, EthosUQuantizer(spec))
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    edge = to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                       partitioner=[EthosUPartitioner(spec, cpu_fallback=True)])
    inside, total = delegated_ops(edge)
    share = inside / max(1, total)
    assert share >= FLOORS.get(name, 0.5), f"{name}: {share:.1%} of compute ops on Ethos-U"
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    got = np.asarray(method.execute([t.numpy() for t in inputs])[0])
    eager = eager_outputs(arch)
    ours, theirs = sqnr_db(got, eager), sqnr_db(oracle, eager)
    assert ours >= theirs - 1.0, f"{name}: Ethos-U {ours:.1f} dB vs eager; its pt2e model {theirs:.1f} dB " \
                                 f"(Ethos-U vs pt2e {sqnr_db(got, oracle):.1f} dB)"
