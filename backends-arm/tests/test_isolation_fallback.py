"""Vela runs in an isolated worker, and a partition Vela refuses or crashes on shrinks instead of failing.

A planted compiler (:mod:`planted_vela`) crashes with SIGSEGV, or refuses, on any graph holding a depthwise
convolution and hands every other graph to the real Vela. Oracles: the caller's process survives and gets an
exception naming the signal; the lowered program (depthwise convolution on the CPU) matches the pt2e model.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import pytest
import torch
from arm_models import build, quantize_and_lower, run, sqnr_db

import edgeport
from edgeport.errors import LoweringError, PartitionError
from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer, vela
from edgeport_arm.trial import _named

TARGET = "ethos-u55-128"
DEPTHWISE = "convolution_1"  # the depthwise convolution of arm_models.ConvBlock, after export


@pytest.fixture
def planted(monkeypatch):
    """Install a planted compiler by name (in the worker; fresh result cache, restored after the test)."""
    import planted_vela

    monkeypatch.setattr(vela, "_CACHE", OrderedDict())
    monkeypatch.delenv("EDGEPORT_ARM_VELA_IN_PROCESS", raising=False)

    def install(name: str) -> None:
        monkeypatch.setattr(vela, "compile_tosa", getattr(planted_vela, name))

    return install


def _lower(partitioner):
    model, x = build("conv_block")
    return quantize_and_lower(model, x, EthosUQuantizer(EthosUCompileSpec(TARGET)), partitioner), x


def test_vela_crash_in_preprocess_is_an_exception_naming_partition_ops_and_signal(planted):
    planted("crash_on_depthwise")
    pid = os.getpid()
    with pytest.raises(LoweringError) as info:
        _lower(EthosUPartitioner(EthosUCompileSpec(TARGET), trial_compile=False))
    text = str(info.value)
    assert os.getpid() == pid
    assert "Vela crashed" in text and "SIGSEGV" in text and "partition 'tag0'" in text
    assert "aten.convolution.default x2" in text  # the partition's op list


@pytest.mark.parametrize("compiler, signal", [("crash_on_depthwise", "SIGSEGV"), ("refuse_depthwise", None)])
def test_refused_partition_shrinks_and_the_rest_still_matches_pt2e(planted, compiler, signal):
    planted(compiler)
    partitioner = EthosUPartitioner(EthosUCompileSpec(TARGET), cpu_fallback=True)
    lowered, x = _lower(partitioner)
    [refusal] = partitioner.refusals
    assert refusal.compiler == "Vela" and refusal.signal == signal and refusal.culprits == [DEPTHWISE, "hardtanh"]
    assert "bisection" in refusal.how  # the conv and its fused clamp leave together
    why = partitioner.rejections[DEPTHWISE]
    assert "Vela refused partition tag0" in why and (signal or "Non-passthrough") in why
    summary = lowered.program.delegation_summary()
    assert "delegated to EthosUBackend: 2 call(s)" in summary, summary  # before and after the depthwise conv
    gen = torch.Generator().manual_seed(3)
    for inp in [x, torch.randn(x.shape, generator=gen)]:
        outs, _ = run(lowered.program.buffer, [inp])
        assert sqnr_db(lowered.converted(inp).detach().numpy(), outs[0]) >= 35.0


def test_require_full_delegation_names_the_refused_node_and_the_compilers_words(planted):
    planted("crash_on_depthwise")
    model, x = build("conv_block")
    qdq = ["quantized_decomposed.quantize_per_tensor", "quantized_decomposed.dequantize_per_tensor"]
    with pytest.raises(PartitionError, match=rf"(?s){DEPTHWISE} \(aten.convolution.default\).*Vela.*SIGSEGV"):
        edgeport.lower(model, (x,), backends=["EthosUBackend"], quantize=True, require_full_delegation=True,
                       allowed_portable_ops=qdq)
    manager = edgeport.lower(model, (x,), backends=["EthosUBackend"], quantize=True)
    cpu = {node: why for node, _, why in manager.lowering_report.portable_ops}
    assert "SIGSEGV" in cpu[DEPTHWISE]
    out = edgeport.runtime.Runtime.get().load_program(manager.buffer).load_method("forward").execute([x])[0]
    assert sqnr_db(model(x).detach().numpy(), np.asarray(out)) >= 20.0


def test_compiler_messages_name_nodes_only_when_quoted_or_leading():
    nodes = [torch.fx.Graph().placeholder(n) for n in ("sigmoid", "add", "conv")]
    named = _named("partition 'tag2': sigmoid (aten.sigmoid.default): needs a quantize; add 'conv' here", nodes)
    assert [n.name for n in named] == ["sigmoid", "conv"]


def test_a_partition_still_refused_after_the_last_round_goes_to_the_cpu_whole(planted, monkeypatch):
    from edgeport_arm import partitioner as arm_partitioner

    planted("refuse_depthwise")
    monkeypatch.setattr(arm_partitioner, "_MAX_TRIAL_ROUNDS", 1)
    partitioner = EthosUPartitioner(EthosUCompileSpec(TARGET), cpu_fallback=True)
    lowered, x = _lower(partitioner)
    [refusal] = partitioner.refusals
    assert "whole partition" in refusal.how and DEPTHWISE in refusal.culprits and len(refusal.culprits) > 2
    assert "delegated to" not in lowered.program.delegation_summary()
    outs, _ = run(lowered.program.buffer, [x])
    assert sqnr_db(lowered.converted(x).detach().numpy(), outs[0]) >= 35.0
