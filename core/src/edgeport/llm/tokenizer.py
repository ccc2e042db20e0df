"""Tokenizers for the runner: Hugging Face ``tokenizers`` (``tokenizer.json``), an optional extra."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HFTokenizer", "load_tokenizer"]


class HFTokenizer:
    """A ``tokenizer.json`` through Hugging Face ``tokenizers`` (``pip install 'edgeport[llm]'``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError("edgeport.llm tokenizers need Hugging Face `tokenizers`: pip install 'edgeport[llm]' "
                              "(or pip install tokenizers)") from exc
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer file at {path}: give the tokenizer.json a checkpoint ships "
                                    "(tokenizer.save_pretrained writes one)")
        self._tok: Any = Tokenizer.from_file(path)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


def load_tokenizer(path: str | os.PathLike[str]) -> HFTokenizer:
    """A tokenizer from a ``tokenizer.json`` (or a directory holding one)."""
    return HFTokenizer(path)
