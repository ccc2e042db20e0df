"""Every architecture of ``edgeport.testing.architectures`` (Hugging Face models from small configs, random weights)
lowered with ``QnnPartitioner`` and run on edgeport's runtime (QNN HTP emulator).

* fp32: ``edgeport.lower(model, inputs, backends=["QnnBackend"])`` within 1e-3 of eager PyTorch, relative to the
  output's scale (measured: 9e-8 to 4e-7; mobilenet_v2_seg
  6.5e-6: dilated depthwise convolutions, see docs/backends/qnn.md).
* 8a8w: the pt2e-converted model (``QnnQuantizer``, calibrated on 4 random batches and the example) is the oracle;
  the QNN program's SQNR against eager must be within 1 dB of the converted model's own SQNR against eager (when
  the converted model is below 0 dB against eager, e.g. an output far smaller than one output step: QNN within 2
  output steps of it).
  ResNet in the default run, the rest with ``-m slow`` (10-40 s each on the emulator). mobilenet_v2_seg: QNN
  10.3 dB, its pt2e model 8.0 dB (4.9 dB apart: that model is chaotic under sub-step input noise, see the docs).

Named ``test_soc_*`` to run after the modules that build float32 graphs in the test process: running a quantized
program here creates a SoC-configured HTP device, after which the emulator prepares this process's float32 graphs
at fp16 precision (lowering is unaffected: it happens in workers).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, Architecture, assert_close_to_scale, eager_outputs
from edgeport.testing.int8_suite import pt2e_convert, sqnr_db

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("requires_qnn")

NAMES = sorted(ARCHITECTURES)
DEFAULT_INT8 = ("resnet",)


@functools.cache
def _arch(name: str) -> Architecture:
    return ARCHITECTURES[name](seed=0, size="small")


def _run(program, inputs) -> np.ndarray:
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    return method.execute([x.numpy() for x in inputs])[0]


@pytest.mark.parametrize("name", NAMES)
def test_fp32(name):
    arch = _arch(name)
    program = edgeport.lower(arch.model, arch.example_inputs, backends=["QnnBackend"])
    assert any(b == "QnnBackend" for b, _ in program.lowering_report.delegates)
    assert_close_to_scale(_run(program, arch.example_inputs), eager_outputs(arch), f"{name} fp32 on QNN", 1e-3)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT_INT8 else pytest.mark.slow)
                                  for n in NAMES])
def test_int8(name):
    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.quantizer import QnnQuantizer

    arch = _arch(name)
    inputs = arch.example_inputs
    converted = pt2e_convert(arch, QnnQuantizer())
    eager = eager_outputs(arch)
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    ep_converted = torch.export.export(converted, inputs)
    program = edgeport.to_edge_transform_and_lower(ep_converted, partitioner=[QnnPartitioner()]).to_executorch()
    got = _run(program, inputs)
    ours, theirs = sqnr_db(got, eager), sqnr_db(oracle, eager)
    if theirs < 0:  # the pt2e model does not represent eager at all (e.g. an output far below one output step)
        (out,) = [n for n in ep_converted.graph.nodes if n.op == "output"][0].args[0]
        step = float(out.args[1]) if "dequantize_per_tensor" in str(out.target) else float(np.abs(oracle).max())
        assert np.abs(got - oracle).max() <= 2 * step, f"{name}: pt2e vs eager {theirs:.1f} dB; QNN is more " \
                                                       "than 2 output steps from the pt2e model"
        return
    assert ours >= theirs - 1.0, f"{name}: QNN {ours:.1f} dB vs eager; its pt2e model {theirs:.1f} dB " \
                                 f"(QNN vs pt2e {sqnr_db(got, oracle):.1f} dB)"
