"""ExecuTorch's tuned LLM program (test and bench only: this module imports ``executorch``).

ExecuTorch's own LLM flow, as its ``export_llm`` command runs it: its Llama ``Transformer``
(``executorch.examples.models.llama``) built from a ``params.json`` and a checkpoint of random weights, rewritten
by its source transformations into its custom ops (``llama::update_cache`` for the KV cache, ``llama::custom_sdpa``
for attention; ``use_sdpa_with_kv_cache``), optionally 8da4w-quantized (group 32), exported with a dynamic token
count and lowered with its XNNPACK partitioners (dynamically quantized linears first, then the rest:
``backend.xnnpack.extended_ops``). The public entry point is ``export_llama(LlmConfig)``, which is what
``python -m executorch.extension.llm.export.export_llm`` calls; it writes the ``.pte`` to ``export.output_dir``.

The checkpoint is written here (``construct_transformer`` on the CPU with a seed: PyTorch's default initialization,
RMSNorm weights 1): without one, ExecuTorch 1.5.1 builds the model on the meta device and then calls
``to_empty``, which leaves the RMSNorm weights and the RoPE tables uninitialized memory, so its "random weights"
program computes NaN logits.

The program's forward takes ``tokens [1, n]`` (int64, ``1 <= n < max_seq_len``) and ``input_pos [1]`` (the start
position) and returns the logits of the last token ``[1, vocab]``; its metadata constant methods are ExecuTorch's.

:func:`build_tuned` returns the ``.pte`` bytes and, on request, ExecuTorch's eager Llama module with the same
weights (built again by the same code from the same checkpoint; its custom ops run eagerly through
``executorch.extension.llm.custom_ops``), so tests can compare the runtimes with eager PyTorch.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: params.json of each size (ExecuTorch's ``ModelArgs`` names); ``medium`` is bench/llm.py's hidden 512 x 4 layers
#: (``hidden_dim`` 1536 is also what ``multiple_of=256`` derives from dim 512)
SIZES: dict[str, dict[str, Any]] = {
    "small": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "hidden_dim": 128,
              "norm_eps": 1e-5, "rope_theta": 10000.0},
    "medium": {"dim": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "vocab_size": 4096, "hidden_dim": 1536,
               "norm_eps": 1e-5, "rope_theta": 10000.0},
}
SCHEMES = ("fp32", "8da4w")


@dataclass
class TunedProgram:
    """ExecuTorch's tuned program (``pte``), its params, and (when asked for) its eager module."""

    pte: bytes
    params: dict[str, Any]
    scheme: str
    max_seq_len: int
    max_context_len: int
    eager: Any = None

    def eager_logits(self, tokens: list[int], start: int) -> Any:
        """Eager forward of ``tokens`` from position ``start`` (state carries between calls, as on device):
        the last token's logits as a numpy array."""
        import torch

        if self.eager is None:
            raise ValueError("built without eager=True")
        with torch.no_grad():
            out = self.eager(torch.tensor([tokens], dtype=torch.long),
                             {"input_pos": torch.tensor([start], dtype=torch.long)})
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(-1, out.shape[-1])[-1].float().numpy()


def llm_config(params_path: str, checkpoint: str, out_dir: str, scheme: str, max_seq_len: int,
               max_context_len: int, attention_mask: bool = False) -> Any:
    """ExecuTorch's ``LlmConfig`` for the tuned flow (what ``export_llm`` would parse from its options)."""
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: expected one of {SCHEMES}")
    cfg = LlmConfig()
    cfg.base.params = params_path
    cfg.base.checkpoint = checkpoint
    cfg.base.metadata = json.dumps({"get_bos_id": 1, "get_eos_ids": [2]})
    cfg.model.use_kv_cache = True
    cfg.model.use_sdpa_with_kv_cache = True
    cfg.model.enable_dynamic_shape = True
    if attention_mask:
        cfg.model.use_custom_sdpa_with_attention_mask = True  # read with getattr by export_llama_lib
    cfg.export.max_seq_length = max_seq_len
    cfg.export.max_context_length = max_context_len
    cfg.export.output_dir = out_dir
    cfg.export.output_name = "tuned.pte"
    cfg.backend.xnnpack.enabled = True
    cfg.backend.xnnpack.extended_ops = True
    if scheme == "8da4w":
        cfg.quantization.qmode = "8da4w"
        cfg.quantization.group_size = 32
    return cfg


def build_tuned(size: str = "small", scheme: str = "fp32", *, max_seq_len: int = 64, max_context_len: int = 64,
                seed: int = 0, eager: bool = False, attention_mask: bool = False) -> TunedProgram:
    """Export ExecuTorch's tuned Llama program of ``size`` (:data:`SIZES`) and ``scheme`` (:data:`SCHEMES`)."""
    import torch
    from executorch.examples.models.llama.export_llama_lib import _prepare_for_llama_export, export_llama
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    if size not in SIZES:
        raise ValueError(f"size {size!r}: expected one of {sorted(SIZES)}")
    params = dict(SIZES[size])
    with tempfile.TemporaryDirectory(prefix="edgeport-et-tuned-") as tmp:
        params_path, checkpoint = Path(tmp) / "params.json", Path(tmp) / "checkpoint.pth"
        params_path.write_text(json.dumps(params))
        torch.manual_seed(seed)
        model = construct_transformer(ModelArgs(**params, max_seq_len=max_seq_len, max_context_len=max_context_len))
        torch.save(model.state_dict(), checkpoint)
        del model

        def config() -> Any:
            return llm_config(str(params_path), str(checkpoint), tmp, scheme, max_seq_len, max_context_len,
                              attention_mask)

        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.WARNING)
        try:
            pte = Path(export_llama(config())).read_bytes()
            module = _prepare_for_llama_export(config()).model.eval() if eager else None
        finally:
            logging.getLogger().setLevel(quiet)
    return TunedProgram(pte, params, scheme, max_seq_len, max_context_len, module)


def et_stepper(pte_path: str, threads: int = 1) -> Any:
    """``step(tokens [1, n] int64, start) -> last logits`` on ExecuTorch's runtime (its Python bindings), with
    the ``llama::`` kernels registered as ExecuTorch's own runner does (importing ``custom_ops``)."""
    import numpy as np
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers the llama:: kernels
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    if hasattr(portable_lib, "_unsafe_reset_threadpool"):
        portable_lib._unsafe_reset_threadpool(threads)
    method = Runtime.get().load_program(pte_path).load_method("forward")

    def step(ids: Any, start: int) -> Any:
        out = method.execute([torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
                              torch.tensor([start], dtype=torch.long)])[0]
        return out.numpy().reshape(-1, out.shape[-1])[-1].copy()

    return step


def greedy(step: Any, prompt: list[int], new: int) -> tuple[list[int], list[Any]]:
    """Prefill ``prompt`` in one call from position 0, then decode ``new - 1`` tokens one at a time (ExecuTorch's
    runner with a prompt shorter than ``get_max_seq_len``); the tokens and each step's logits."""
    import numpy as np

    logits = [step(np.array([prompt], dtype=np.int64), 0)]
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < new:
        logits.append(step(np.array([[tokens[-1]]], dtype=np.int64), len(prompt) + len(tokens) - 1))
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, logits


def et_greedy_in_child(pte: bytes, prompt: list[int], new: int, timeout: float = 600.0) -> tuple[list[int], Any]:
    """:func:`greedy` on ExecuTorch's runtime in a child process (a crash fails the caller, not the process):
    the tokens and a ``[new, vocab]`` array of logits."""
    import subprocess
    import sys

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="edgeport-et-tuned-run-") as tmp:
        path = Path(tmp) / "program.pte"
        path.write_bytes(pte)
        out = Path(tmp) / "logits.npy"
        proc = subprocess.run([sys.executable, __file__, "greedy", str(path), "--prompt", ",".join(map(str, prompt)),
                               "--new", str(new), "--logits", str(out)], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ExecuTorch's runtime failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        tokens = json.loads(proc.stdout.strip().splitlines()[-1])["tokens"]
        return tokens, np.load(out)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write ExecuTorch's tuned program")
    b.add_argument("--size", default="small", choices=sorted(SIZES))
    b.add_argument("--scheme", default="fp32", choices=SCHEMES)
    b.add_argument("--max-seq-len", type=int, default=64)
    b.add_argument("--max-context-len", type=int, default=64)
    b.add_argument("-o", "--output", required=True)
    g = sub.add_parser("greedy", help="greedy tokens on ExecuTorch's runtime (JSON on stdout)")
    g.add_argument("pte")
    g.add_argument("--prompt", required=True, help="comma-separated token ids")
    g.add_argument("--new", type=int, default=24)
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--logits", help="write the logits of every step here (.npy)")
    args = ap.parse_args()
    if args.cmd == "build":
        built = build_tuned(args.size, args.scheme, max_seq_len=args.max_seq_len,
                            max_context_len=args.max_context_len)
        Path(args.output).write_bytes(built.pte)
        return
    import numpy as np

    tokens, logits = greedy(et_stepper(args.pte, args.threads), [int(t) for t in args.prompt.split(",")], args.new)
    if args.logits:
        np.save(args.logits, np.stack(logits))
    print(json.dumps({"tokens": tokens}))


if __name__ == "__main__":
    main()
