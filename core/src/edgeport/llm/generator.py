"""Text in, text out: a :class:`TextRunner` with a tokenizer, streaming decoded text as tokens arrive."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from edgeport.llm.runner import GenerationConfig, GenerationResult, TextRunner
from edgeport.llm.tokenizer import load_tokenizer

__all__ = ["TextGenerator", "load_tokenizer"]


class TextGenerator:
    """Generates text from a prompt: ``TextGenerator("model.pte", "tokenizer.json").generate("Hello", config,
    on_text=print)``; ``on_text`` receives each new piece of text as soon as it decodes to whole characters."""

    def __init__(self, program: Any, tokenizer: Any, **runner_options: Any) -> None:
        self.runner = program if isinstance(program, TextRunner) else TextRunner(program, **runner_options)
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        vocab = self.runner.metadata.vocab_size
        if self.tokenizer.vocab_size > vocab:
            raise ValueError(f"the tokenizer has {self.tokenizer.vocab_size} tokens but the program's vocabulary is "
                             f"{vocab}: they do not belong together")

    def generate(self, prompt: str, config: GenerationConfig | None = None,
                 on_text: Callable[[str], None] | None = None) -> tuple[str, GenerationResult]:
        ids = self.tokenizer.encode(prompt)
        if not ids:
            ids = [self.runner.metadata.bos_id]
        new: list[int] = []
        shown = ""

        def on_token(token: int) -> None:
            nonlocal shown
            new.append(token)
            text = self.tokenizer.decode(new)
            if on_text is not None and len(text) > len(shown) and not text.endswith("\ufffd"):
                on_text(text[len(shown):])
                shown = text

        result = self.runner.generate(ids, config, on_token)
        text = self.tokenizer.decode(result.tokens)
        if on_text is not None and len(text) > len(shown):
            on_text(text[len(shown):])
        return text, result
