"""Helpers of the edgeport-xnnpack tests: lowering with either pipeline, the two runtimes, tolerance checks."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from edgeport_xnnpack import native

needs_xnnpack = pytest.mark.skipif(not native.is_available()[0], reason=native.is_available()[1])
RTOL = 1e-4  # fp32: max |error| relative to the output's scale


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(out) - ref).max() / max(float(np.abs(ref).max()), 1e-12))


def eager(model: torch.nn.Module, args: tuple) -> np.ndarray:
    with torch.no_grad():
        out = model(*args)
    return (out if isinstance(out, torch.Tensor) else out[0]).numpy()


def lower_edgeport(model: torch.nn.Module, args: tuple, **kwargs):
    """(EdgeProgramManager, .pte bytes, partitioner) lowered by edgeport with XnnpackPartitioner."""
    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    partitioner = XnnpackPartitioner(**kwargs)
    edge = edgeport.to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[partitioner])
    return edge, edge.to_executorch().buffer, partitioner


def lower_executorch(model: torch.nn.Module, args: tuple) -> bytes:
    """A .pte lowered by ExecuTorch's own XNNPACK partitioner (test-only oracle)."""
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, args)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def run_edgeport(buffer: bytes, args: tuple) -> np.ndarray:
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return method.execute([a.numpy() for a in args])[0]


def run_executorch(buffer: bytes, args: tuple) -> np.ndarray:
    pytest.importorskip("executorch")
    from executorch.runtime import Runtime

    return Runtime.get().load_program(buffer).load_method("forward").execute(list(args))[0].numpy()


def delegate_count(edge, backend_id: str = "XnnpackBackend") -> int:
    graph = edge.exported_program().graph
    return sum(1 for n in graph.nodes if n.meta.get("delegate_backend") == backend_id)


def sqnr(ref: np.ndarray, out: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio of ``out`` against ``ref``, in dB."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - out) ** 2).sum(), 1e-30)))


def blob_nodes(edge) -> Counter:
    """(node kind, datatype of its output) -> count, over every XNNPACK delegate blob of ``edge``."""
    from edgeport_xnnpack.schema.reader import read_blob

    counts: Counter = Counter()
    for name, module in edge.exported_program().graph_module.named_children():
        if name.startswith("lowered_module"):
            graph, _ = read_blob(module.processed_bytes)
            dtype = {v.id_out: v.datatype for v in graph.values}
            for n in graph.nodes:
                counts[(n.kind, dtype[n.outputs()[0]])] += 1
    return counts


def blob_kinds(edge) -> Counter:
    """Node kind -> count, over every XNNPACK delegate blob of ``edge``."""
    kinds: Counter = Counter()
    for (kind, _), count in blob_nodes(edge).items():
        kinds[kind] += count
    return kinds


def corrupted_blobs(blob: bytes, count: int, seed: int, max_flips: int) -> Iterator[bytes]:
    """``count`` damaged copies of ``blob``: every 4th truncated at a random length, the others with 1 to
    ``max_flips`` random bytes overwritten."""
    rng = random.Random(seed)
    for i in range(count):
        data = bytearray(blob)
        if i % 4 == 0:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, max_flips)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        yield bytes(data)


DECODE_PROMPT = [1, 17, 42, 9, 100, 5, 77]

#: ``(decoder, quantization)`` cases of the decoder tests: fp32 Llama in the default run, 8da4w Llama and Qwen2 slow
DECODER_CASES = [("llama", None), pytest.param("llama", "8da4w", marks=pytest.mark.slow),
                 pytest.param("qwen2", None, marks=pytest.mark.slow)]


def small_decoder(name: str, scheme: str | None) -> tuple[torch.nn.Module, bytes]:
    """A small random-weight Hugging Face decoder (``edgeport.testing.decoders``) and its edgeport program (max
    sequence 16, context 32, quantized with ``scheme``); skips without ``transformers`` (or ``torchao``)."""
    pytest.importorskip("transformers")
    if scheme:
        pytest.importorskip("torchao")
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS

    model = DECODERS[name](size="small")
    return model, export_decoder(model, max_seq_len=16, max_context_len=32, quantize=scheme).manager.buffer


def greedy_decode(method, steps: int, prompt: list[int] = DECODE_PROMPT, every_output: bool = False) -> list:
    """Copies of what an LLM method (inputs: token ids ``[1, n]``, cache positions ``[n]``) returns for one prefill
    of ``prompt`` and ``steps`` greedy decode steps: the logits of each call, or every output of each call (a list
    per call, logits first) with ``every_output``."""
    def call(ids: list, positions: np.ndarray) -> list:
        outs = [np.array(o) for o in method.execute([np.array([ids], np.int64), positions])]
        return outs if every_output else [outs[0]]

    calls = [call(prompt, np.arange(len(prompt), dtype=np.int64))]
    for i in range(steps):
        logits = calls[-1][0]
        token = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
        calls.append(call([token], np.array([len(prompt) + i], np.int64)))
    return calls if every_output else [c[0] for c in calls]


def forget_planning(planner) -> None:
    """Empty a delegate planner's caches and every kept layout and copy table: its next plan is made from scratch
    (the uncached path, the oracle of the planning caches)."""
    from edgeport_xnnpack import _copies, _plan

    planner._io, planner._kind_why, planner._groups, planner._padded = None, {}, {}, {}
    _plan.clear_layouts()
    _copies.clear_memo()


def eager_greedy_tokens(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    """The ``new`` tokens a Hugging Face decoder generates greedily after ``prompt`` in eager PyTorch."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


class StepTracer:
    """An event tracer that records nothing: while one is set, the XNNPACK executor runs the general path, step by
    step (the oracle of the direct call)."""

    def now_ns(self) -> int:
        return 0

    def log_profiling_delegate(self, *args, **kwargs) -> None:
        pass
