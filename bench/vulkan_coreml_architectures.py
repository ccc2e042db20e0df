"""Architecture suite on Vulkan and Core ML: edgeport vs ExecuTorch 1.5.1's partitioners on the same exports.

For every architecture of ``edgeport.testing.architectures.ARCHITECTURES`` (small configs, random weights) and a
few more Hugging Face models built here (``EXTRA``: decoders whose attention starts from ``transformers``' empty KV
cache, more encoders, vision and segmentation models):

* Vulkan: ``edgeport.lower(model, inputs, backends=["VulkanBackend"])``, run on edgeport's runtime (lavapipe here),
  error = max |out - eager| / max(1, max |eager|); ExecuTorch: ``to_edge_transform_and_lower(ep,
  partitioner=[VulkanPartitioner()])`` (lowering only: its Vulkan runtime is not in the Linux wheel);
* Core ML: ``edgeport.lower(..., backends=["CoreMLBackend"])`` and ExecuTorch's ``CoreMLPartitioner`` (lowering
  only: Core ML predicts on macOS).

Share = compute ops (``call_function`` nodes other than ``getitem``) inside delegates / all compute ops, counted on
each framework's own edge program after lowering (their decompositions differ, so counts differ; shares compare).

Usage::

    python bench/vulkan_coreml_architectures.py                  # markdown on stdout
    python bench/vulkan_coreml_architectures.py --write-report   # also its section of REPORT.md
    python bench/vulkan_coreml_architectures.py --no-executorch  # edgeport only (ExecuTorch's Vulkan: ~1 min each)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import operator
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import write_section  # noqa: E402  (bench/ is not a package)

SECTION_TITLE = "## Architecture suite: Vulkan and Core ML"


def _text(name: str, make: Callable[[Any], Any]) -> Callable[..., Any]:
    def build(seed: int = 0, size: str = "small") -> Any:
        import torch
        import transformers as T

        from edgeport.testing.architectures import Architecture

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inner = make(T)

        class Out(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x):
                out = self.inner(x)
                return out.logits if hasattr(out, "logits") else out.last_hidden_state

        kind = "vision" if "pixel" in str(getattr(inner, "main_input_name", "")) else "text"
        arch = Architecture(name, Out().eval(), (), kind=kind, vocab=128, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        arch.example_inputs = arch.inputs_for(8) if kind == "text" else (torch.randn(1, 3, 32, 32, generator=gen),)
        return arch

    return build


def _decoder(cls: str, cfg: str, **kw: Any) -> Callable[[Any], Any]:
    return lambda T: getattr(T, cls)(getattr(T, cfg)(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, **kw))


EXTRA: dict[str, Callable[..., Any]] = {
    "qwen2_kv2": _text("qwen2_kv2", _decoder("Qwen2ForCausalLM", "Qwen2Config")),
    "mistral": _text("mistral", _decoder("MistralForCausalLM", "MistralConfig")),
    "gemma": _text("gemma", _decoder("GemmaForCausalLM", "GemmaConfig", head_dim=8)),
    "phi3": _text("phi3", _decoder("Phi3ForCausalLM", "Phi3Config", pad_token_id=0)),
    "roberta": _text("roberta", lambda T: T.RobertaModel(T.RobertaConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=66, pad_token_id=1))),
    "albert": _text("albert", lambda T: T.AlbertModel(T.AlbertConfig(
        vocab_size=128, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64))),
    "deit": _text("deit", lambda T: T.DeiTModel(T.DeiTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64))),
    "swin": _text("swin", lambda T: T.SwinModel(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4))),
    "segformer": _text("segformer", lambda T: T.SegformerForSemanticSegmentation(T.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
        decoder_hidden_size=32, num_labels=4))),
}


def share_of(program: Any, inside_of: Callable[[Any], int]) -> tuple[int, int]:
    """(compute ops inside delegates, compute ops outside) of a lowered edge program."""
    inside = outside = 0
    for n in program.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "call_delegate" in str(getattr(n.target, "__name__", n.target)):
            inside += inside_of(n)
        else:
            outside += 1
    return inside, outside


def _ops(gm: Any) -> int:
    return sum(1 for m in gm.graph.nodes if m.op == "call_function" and m.target is not operator.getitem)


def ours(arch: Any, backend: str, run: bool) -> dict[str, Any]:
    import numpy as np

    import edgeport
    from edgeport.runtime import Runtime
    from edgeport.testing.architectures import eager_outputs, scale_error

    row: dict[str, Any] = {}
    try:
        manager = edgeport.lower(arch.model, arch.example_inputs, backends=[backend])
    except Exception as exc:  # noqa: BLE001 - a failed lowering is a result of the benchmark
        row["lowered"] = f"no: {type(exc).__name__}: {str(exc)[:120]}"
        return row
    report = manager.lowering_report
    inside, outside = sum(o for _, o in report.delegates), len(report.portable_ops)
    row.update(lowered="yes", share=inside / max(1, inside + outside), ops=(inside, outside),
               delegates=len(report.delegates))
    if run:
        try:
            method = Runtime.get().load_program(manager.buffer).load_method("forward")
            got = method.execute([t.numpy() for t in arch.example_inputs])[0]
            row["ran"], row["error"] = "yes", scale_error(np.asarray(got), eager_outputs(arch))
        except Exception as exc:  # noqa: BLE001
            row["ran"] = f"no: {type(exc).__name__}: {str(exc)[:120]}"
    return row


def theirs(arch: Any, backend: str) -> dict[str, Any]:
    import torch
    from executorch.exir import to_edge_transform_and_lower

    if backend == "VulkanBackend":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner as P
    else:
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner as P
    try:
        ep = torch.export.export(arch.model, arch.example_inputs)
        program = to_edge_transform_and_lower(ep, partitioner=[P()]).exported_program()
    except Exception as exc:  # noqa: BLE001
        return {"lowered": f"no: {type(exc).__name__}: {str(exc)[:120]}"}
    inside, outside = share_of(program, lambda n: _ops(getattr(program.graph_module, n.args[0].target)
                                                        .original_module))
    return {"lowered": "yes", "share": inside / max(1, inside + outside), "ops": (inside, outside)}


def _pct(row: dict[str, Any]) -> str:
    if "share" not in row:
        return "-"
    inside, outside = row["ops"]
    return f"{row['share']:.1%} ({inside}/{inside + outside})"


def _yes(v: str | None) -> str:
    return "-" if v is None else v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--no-executorch", action="store_true", help="do not lower with ExecuTorch (its cached results "
                    "are still shown)")
    ap.add_argument("--only", nargs="*", help="architecture names")
    ap.add_argument("--executorch-cache", type=Path, help="JSON file of ExecuTorch's results, read and extended (its "
                    "lowering does not depend on edgeport's code: rerun edgeport's side alone)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    from edgeport.testing.architectures import ARCHITECTURES

    builders = {**ARCHITECTURES, **EXTRA}
    cache: dict[str, Any] = {}
    if args.executorch_cache and args.executorch_cache.exists():
        cache = json.loads(args.executorch_cache.read_text())

    def executorch(arch: Any, name: str, backend: str) -> dict[str, Any]:
        key = f"{name}/{backend}"
        if args.no_executorch:
            return cache.get(key, {})  # cached results only
        if key not in cache:
            cache[key] = theirs(arch, backend)
            if args.executorch_cache:
                args.executorch_cache.write_text(json.dumps(cache, indent=1))
        return cache[key]

    names = [n for n in builders if not args.only or n in args.only]
    start = _dt.datetime.now(_dt.UTC)
    vk_rows, cm_rows = [], []
    for name in names:
        arch = builders[name]()
        tag = name if name in ARCHITECTURES else f"{name} (extra)"
        try:
            vk = ours(arch, "VulkanBackend", run=True)
            cm = ours(arch, "CoreMLBackend", run=False)
            et_vk = executorch(arch, name, "VulkanBackend")
            et_cm = executorch(arch, name, "CoreMLBackend")
        except Exception:  # noqa: BLE001 - keep going, show the failure
            traceback.print_exc()
            continue
        err = f"{vk['error']:.1e}" if "error" in vk else "-"
        vk_rows.append(f"| {tag} | {vk['lowered']} | {_yes(vk.get('ran'))} | {err} | {_pct(vk)} | "
                       f"{_yes(et_vk.get('lowered'))} | {_pct(et_vk)} |")
        cm_rows.append(f"| {tag} | {cm['lowered']} | {_pct(cm)} | {_yes(et_cm.get('lowered'))} | {_pct(et_cm)} |")
        print(vk_rows[-1], cm_rows[-1], sep="\n", file=sys.stderr, flush=True)
    import coremltools
    import torch

    lines = [SECTION_TITLE, "",
             f"Measured by `bench/vulkan_coreml_architectures.py` on {start:%Y-%m-%d %H:%M} UTC: torch {torch.__version__}, "
             f"coremltools {coremltools.__version__}" + ("" if args.no_executorch and not cache else ", executorch 1.5.1") +
             "; small configs (hidden 32, 2 layers), random weights; `(extra)` rows are built by the script, the "
             "others are `edgeport.testing.architectures.ARCHITECTURES`. Share = compute ops inside delegates / all "
             "compute ops, on each framework's own lowered edge program (inside/all). Error = max |out - eager| / "
             "max(1, max |eager|) on edgeport's runtime (lavapipe). ExecuTorch: lowering only.", "",
             "### Vulkan", "",
             "| model | lowered | ran | error | share delegated | ExecuTorch lowered | ExecuTorch share |",
             "|---|---|---|---:|---:|---|---:|", *vk_rows, "",
             "### Core ML (lowering only: Core ML predicts on macOS)", "",
             "| model | lowered | share delegated | ExecuTorch lowered | ExecuTorch share |",
             "|---|---|---:|---|---:|", *cm_rows, ""]
    section = "\n".join(lines)
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
