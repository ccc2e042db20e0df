"""ExecuTorch's LLM metadata: constant methods a text-generation program carries, named and typed as its
``export_llm`` writes them, so ExecuTorch's runner and edgeport's read the same program."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LlmMetadata", "METADATA_METHODS"]

#: constant method -> what it returns (ExecuTorch's ``export_llm`` names)
METADATA_METHODS = {
    "get_max_seq_len": "int: most tokens one forward call takes (the prefill chunk)",
    "get_max_context_len": "int: KV-cache length (prompt + generated tokens)",
    "get_vocab_size": "int",
    "get_bos_id": "int",
    "get_eos_ids": "list of int",
    "get_n_layers": "int",
    "use_kv_cache": "bool",
    "use_sdpa_with_kv_cache": "bool",
    "enable_dynamic_shape": "bool: forward takes a sequence of up to get_max_seq_len tokens",
}


@dataclass(frozen=True)
class LlmMetadata:
    """What a generation program says about itself (see :data:`METADATA_METHODS`)."""

    max_seq_len: int
    max_context_len: int
    vocab_size: int
    bos_id: int
    eos_ids: tuple[int, ...] = ()
    n_layers: int = 0
    use_kv_cache: bool = True
    use_sdpa_with_kv_cache: bool = False
    enable_dynamic_shape: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def constant_methods(self) -> dict[str, Any]:
        """The constant methods to write (``to_edge(..., constant_methods=...)``)."""
        methods: dict[str, Any] = {
            "get_max_seq_len": int(self.max_seq_len),
            "get_max_context_len": int(self.max_context_len),
            "get_vocab_size": int(self.vocab_size),
            "get_bos_id": int(self.bos_id),
            "get_eos_ids": [int(e) for e in self.eos_ids],
            "get_n_layers": int(self.n_layers),
            "use_kv_cache": bool(self.use_kv_cache),
            "use_sdpa_with_kv_cache": bool(self.use_sdpa_with_kv_cache),
            "enable_dynamic_shape": bool(self.enable_dynamic_shape),
        }
        methods.update(self.extra)
        return methods

    @classmethod
    def read(cls, program: Any) -> LlmMetadata:
        """Read the metadata of a loaded :class:`edgeport.runtime.Program` (missing methods get ExecuTorch's
        runner defaults; ``get_max_seq_len`` and ``get_vocab_size`` are required)."""
        names = program.method_names
        missing = [n for n in ("get_max_seq_len", "get_vocab_size") if n not in names]
        if missing:
            raise ValueError(f"the program has no {', '.join(missing)} method(s): it is not a text-generation "
                             "program written by `edgeport export-llm` or ExecuTorch's export_llm")

        def values(name: str) -> list[Any]:
            return list(program.load_method(name).execute([])) if name in names else []

        def one(name: str, default: Any) -> Any:
            found = values(name)
            return found[0] if found else default

        max_seq = int(one("get_max_seq_len", 0))
        return cls(max_seq_len=max_seq, max_context_len=int(one("get_max_context_len", max_seq)),
                   vocab_size=int(one("get_vocab_size", 0)), bos_id=int(one("get_bos_id", 0)),
                   eos_ids=tuple(int(e) for e in values("get_eos_ids")), n_layers=int(one("get_n_layers", 0)),
                   use_kv_cache=bool(one("use_kv_cache", True)),
                   use_sdpa_with_kv_cache=bool(one("use_sdpa_with_kv_cache", False)),
                   enable_dynamic_shape=bool(one("enable_dynamic_shape", True)))
