"""A text-generation runner with ExecuTorch's semantics, on edgeport's runtime (no torch).

The program is a decoder with its KV cache as state (``forward(tokens[1, n], positions) -> logits``) plus the
metadata constant methods of :mod:`edgeport.llm.metadata`. One generation: the prompt is prefilled in chunks of at
most ``get_max_seq_len`` tokens (one token per call when the program has no dynamic sequence length), then tokens
are decoded one at a time until an end-of-sequence id or the token budget; each token goes to a callback as soon
as it is chosen.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport.llm.metadata import LlmMetadata
from edgeport.llm.sampling import Sampler, SamplingConfig

__all__ = ["GenerationConfig", "GenerationResult", "GenerationStats", "TextRunner"]


@dataclass(frozen=True)
class GenerationConfig:
    """``max_new_tokens`` to generate at most; sampling (``temperature`` 0 = greedy, ``top_p``, ``seed``);
    ``stop_on_eos``: stop at one of the program's end-of-sequence ids (``get_eos_ids``)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_on_eos: bool = True

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.seed)


@dataclass
class GenerationStats:
    """Timings of one generation (seconds) and the process's peak resident memory."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    time_to_first_token_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    peak_rss_bytes: int = 0
    stop_reason: str = ""  # "eos" or "max_new_tokens"

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens decoded after the first one (which prefill produces), per second of decoding."""
        steps = max(0, self.generated_tokens - 1)
        return steps / self.decode_s if self.decode_s > 0 else 0.0

    def __str__(self) -> str:
        return (f"prompt {self.prompt_tokens} tokens, generated {self.generated_tokens} ({self.stop_reason}); "
                f"time to first token {self.time_to_first_token_s * 1e3:.1f} ms; "
                f"prefill {self.prefill_tokens_per_s:.1f} tokens/s; decode {self.decode_tokens_per_s:.1f} tokens/s; "
                f"peak RSS {self.peak_rss_bytes / 2**20:.1f} MiB")


@dataclass
class GenerationResult:
    tokens: list[int]
    stats: GenerationStats


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux: ``VmHWM``, which, unlike ``ru_maxrss``, is not
    inherited from the parent across ``exec``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class TextRunner:
    """Generates tokens with a decoder program on edgeport's runtime.

    ``program``: a path, bytes, or a loaded :class:`edgeport.runtime.Program`; ``backend_options`` and
    ``data_path`` (the ``.ptd`` holding weights stored apart from the program) go to the runtime.

    ``prepare_decode`` (default on): at load, run the one-token decode shape once in scratch memory
    (:meth:`edgeport.runtime.Method.prepare`), so that the delegates' one-time specialization for it happens here
    and not in the first decode step; the KV cache is untouched. ``prepare_s`` is the time it took.
    """

    def __init__(self, program: Any, *, method: str = "forward", backend_options: dict[str, Any] | None = None,
                 data_path: Any = None, prepare_decode: bool = True) -> None:
        from edgeport.runtime import Program, Runtime

        if not isinstance(program, Program):
            if isinstance(program, (str, os.PathLike)) and not os.path.isfile(program):
                raise FileNotFoundError(f"no program at {os.fspath(program)}")
            program = Runtime.get().load_program(program, data_path=data_path)
        self.program = program
        self.metadata = LlmMetadata.read(program)
        if method not in program.method_names:
            raise ValueError(f"the program has no method {method!r}; methods: {sorted(program.method_names)}")
        self._method = program.load_method(method, backend_options=backend_options)
        meta = self._method.metadata
        if len(meta.inputs) != 2:
            raise ValueError(f"method {method!r} takes {len(meta.inputs)} inputs; a decoder program takes two "
                             "(tokens [1, n] and their positions)")
        self._positions_shape = tuple(meta.inputs[1].shape)
        planned = int(meta.inputs[0].shape[-1])  # ExecuTorch's export_llama bounds a call at get_max_seq_len - 1
        self._chunk = max(1, min(self.metadata.max_seq_len, planned)) if self.metadata.enable_dynamic_shape else 1
        self.prepare_s = 0.0
        if prepare_decode:
            begin = time.perf_counter()
            self._method.prepare(self._inputs([0], 0))
            self.prepare_s = time.perf_counter() - begin

    def _inputs(self, tokens: Sequence[int], start: int) -> list[np.ndarray]:
        n = len(tokens)
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, n)
        if self._positions_shape == (1,):
            return [ids, np.array([start], dtype=np.int64)]  # ExecuTorch's llama export: the start position
        return [ids, np.arange(start, start + n, dtype=np.int64)]  # Hugging Face: one cache position per token

    # -- one forward call ----------------------------------------------------------------------------------
    def _forward(self, tokens: Sequence[int], start: int) -> np.ndarray:
        logits = np.asarray(self._method.execute(self._inputs(tokens, start))[0])
        return logits.reshape(-1, logits.shape[-1])[-1]

    def check_tokens(self, tokens: Sequence[int], what: str = "prompt") -> list[int]:
        """``tokens`` as a list of ints, each a valid id of the program's vocabulary, else ``ValueError``."""
        arr = np.asarray(tokens)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"{what}: token ids must be a flat sequence of integers, got dtype {arr.dtype} with "
                             f"shape {arr.shape}")
        vocab = self.metadata.vocab_size
        bad = arr[(arr < 0) | (arr >= vocab)] if arr.size else arr
        if bad.size:
            raise ValueError(f"{what}: token id {int(bad[0])} is outside the vocabulary [0, {vocab}) of the program; "
                             "use the tokenizer the program was exported with")
        return [int(t) for t in arr]

    def prefill(self, tokens: Sequence[int], start: int = 0) -> np.ndarray:
        """Run ``tokens`` through the model from position ``start`` (chunks of ``get_max_seq_len``); the logits
        of the last one."""
        tokens = self.check_tokens(tokens)
        if not tokens:
            raise ValueError("prompt: no tokens to prefill")
        end = start + len(tokens)
        if end > self.metadata.max_context_len:
            raise ValueError(f"prompt: {len(tokens)} tokens from position {start} run past the program's context of "
                             f"{self.metadata.max_context_len} tokens (get_max_context_len); shorten the prompt or "
                             "export with a larger --max-context-len")
        logits = None
        for i in range(0, len(tokens), self._chunk):
            logits = self._forward(tokens[i:i + self._chunk], start + i)
        return logits  # type: ignore[return-value]

    def generate(self, prompt_tokens: Sequence[int], config: GenerationConfig | None = None,
                 on_token: Callable[[int], None] | None = None) -> GenerationResult:
        """Prefill ``prompt_tokens`` from position 0, then decode up to ``config.max_new_tokens`` tokens."""
        config = config or GenerationConfig()
        prompt = self.check_tokens(prompt_tokens)
        if not prompt:
            raise ValueError("prompt: empty; give at least one token (most models start with get_bos_id)")
        if not isinstance(config.max_new_tokens, int) or config.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {config.max_new_tokens!r}")
        context = self.metadata.max_context_len
        if len(prompt) + config.max_new_tokens > context:
            raise ValueError(f"a {len(prompt)}-token prompt and {config.max_new_tokens} new tokens need "
                             f"{len(prompt) + config.max_new_tokens} positions but the program's context is "
                             f"{context} (get_max_context_len): ask for at most {max(0, context - len(prompt))} new "
                             "tokens, shorten the prompt, or export with a larger --max-context-len")
        sampler = Sampler(config.sampling())
        eos = set(self.metadata.eos_ids) if config.stop_on_eos else set()
        stats = GenerationStats(prompt_tokens=len(prompt))
        begin = time.perf_counter()
        logits = self.prefill(prompt)
        token = sampler(logits)
        stats.prefill_s = stats.time_to_first_token_s = time.perf_counter() - begin
        out = [token]
        if on_token is not None:
            on_token(token)
        decode_begin = time.perf_counter()
        stats.stop_reason = "max_new_tokens"
        while True:
            if token in eos:
                stats.stop_reason = "eos"
                break
            if len(out) >= config.max_new_tokens:
                break
            token = sampler(self._forward([token], len(prompt) + len(out) - 1))
            out.append(token)
            if on_token is not None:
                on_token(token)
        stats.decode_s = time.perf_counter() - decode_begin
        stats.generated_tokens = len(out)
        stats.peak_rss_bytes = peak_rss_bytes()
        return GenerationResult(out, stats)
