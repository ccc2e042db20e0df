"""``edgeport export-llm`` and ``edgeport generate``.

    edgeport export-llm CHECKPOINT_DIR [--quantize 8da4w] [--group-size 32] [--max-seq-len N]
                        [--max-context-len N] [--target cpu] -o model.pte
    edgeport generate model.pte --tokenizer tokenizer.json --prompt "..." [--max-new-tokens N]
                      [--temperature T --top-p P --seed S] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["configure_export_llm_command", "configure_generate_command"]


def configure_export_llm_command(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="directory with config.json and *.safetensors (as save_pretrained writes)")
    p.add_argument("-o", "--output", required=True, help="path of the .pte to write")
    p.add_argument("--quantize", choices=["8da4w", "8da8w"], help="torchao scheme for the linear layers")
    p.add_argument("--quantize-embedding", choices=["4", "8"], help="weight-only bits for the embedding")
    p.add_argument("--group-size", type=int, default=32, help="group size of 4-bit weights (32, 64, 128, 256)")
    p.add_argument("--max-seq-len", type=int, default=128, help="most tokens per forward call (prefill chunk)")
    p.add_argument("--max-context-len", type=int, help="KV-cache length (default: --max-seq-len)")
    p.add_argument("--target", default="cpu", help="target profile (default: cpu = XNNPACK)")
    p.add_argument("--weights-file", metavar="TAG", help="store the delegates' weights in TAG.ptd beside the .pte "
                   "(give it to generate with --data-path)")
    p.set_defaults(func=run_export_llm)


def configure_generate_command(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="a .pte written by export-llm (or ExecuTorch's export_llm)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json (Hugging Face tokenizers)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="XNNPACK threads (default 1: decode steps are small)")
    p.add_argument("--data-path", help="the .ptd holding weights stored apart from the program")
    p.set_defaults(func=run_generate)


def _progress(stream: Any) -> Any:
    start = time.perf_counter()
    tty = stream.isatty()

    def show(stage: str) -> None:
        text = f"[{time.perf_counter() - start:6.1f} s] {stage}"
        stream.write(("\r\033[K" + text) if tty else text + "\n")
        stream.flush()

    return show


def run_export_llm(args: argparse.Namespace) -> int:
    from edgeport.llm.export import export_llm

    show = _progress(sys.stderr)
    try:
        exported = export_llm(args.checkpoint, max_seq_len=args.max_seq_len, max_context_len=args.max_context_len,
                              quantize=args.quantize, quantize_embedding=args.quantize_embedding,
                              group_size=args.group_size, target=args.target, weights_file=args.weights_file,
                              progress=show)
        show("write")
        paths = exported.save(args.output)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"\nedgeport export-llm: {exc}", file=sys.stderr)
        return 2
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    size = len(exported.manager.buffer)
    m = exported.metadata
    print(f"wrote {', '.join(paths)}: program {size / 2**20:.1f} MiB, context {m.max_context_len} tokens, prefill chunk "
          f"{m.max_seq_len}, vocabulary {m.vocab_size}, eos {list(m.eos_ids)}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from edgeport.llm.generator import TextGenerator
    from edgeport.llm.runner import GenerationConfig

    try:
        begin = time.perf_counter()
        generator = TextGenerator(args.program, args.tokenizer, data_path=args.data_path,
                                  backend_options={"XnnpackBackend": {"num_threads": args.threads}})
        load_s = time.perf_counter() - begin
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p, seed=args.seed)
        sys.stdout.write(args.prompt)

        def stream(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        _, result = generator.generate(args.prompt, config, on_text=stream)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"\nedgeport generate: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    print(f"loaded in {load_s * 1e3:.1f} ms (of which {generator.runner.prepare_s * 1e3:.1f} ms preparing the "
          f"one-token decode step); {result.stats}", file=sys.stderr)
    return 0
