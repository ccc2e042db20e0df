"""Quantized embeddings that dequantize only the rows a call reads.

torchao's ``IntxWeightOnlyConfig`` leaves an ``nn.Embedding`` whose weight dequantizes as a whole: exported as it
is, every call would dequantize the full table (vocabulary x hidden: 262M values for a Llama-3.2-1B-sized model)
to read a handful of rows. :func:`gather_quantized_embeddings` swaps such modules for
:class:`GatheredQuantizedEmbedding`, which gathers the int8 rows, their scales and zero points with plain
``embedding`` lookups and dequantizes those rows with torchao's arithmetic (``(q - zero_point) * scale`` in the
output dtype, element by element): the same values, per call proportional to the tokens, with only standard ops
that both runtimes run (ExecuTorch's flow uses its ``quantized_decomposed::embedding_4bit`` kernel for this).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GatheredQuantizedEmbedding", "gather_quantized_embeddings"]


class GatheredQuantizedEmbedding(torch.nn.Module):
    """An embedding over a row-wise quantized table (``qdata`` int8 ``[V, D]``, ``scale`` / ``zero_point``
    ``[V, D / group]``)."""

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if qdata.dim() != 2 or qdata.shape[1] % group or scale.shape != (qdata.shape[0], qdata.shape[1] // group):
            raise ValueError(f"quantized embedding table {tuple(qdata.shape)} with scales {tuple(scale.shape)} and "
                             f"group {group}: expected scales of shape (rows, columns / group)")
        self.register_buffer("qdata", qdata.detach().clone())
        self.register_buffer("scale", scale.detach().clone())
        self.register_buffer("zero_point", None if zero_point is None else zero_point.detach().clone())
        self.group, self.out_dtype = group, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.embedding(ids, self.qdata)
        groups = rows.shape[:-1] + (rows.shape[-1] // self.group, self.group)
        values = rows.to(self.out_dtype).reshape(groups)
        if self.zero_point is not None:
            values = values - torch.nn.functional.embedding(ids, self.zero_point).to(self.out_dtype).unsqueeze(-1)
        values = values * torch.nn.functional.embedding(ids, self.scale).unsqueeze(-1)
        return values.reshape(rows.shape).to(self.out_dtype)


def _gathered(module: torch.nn.Embedding) -> GatheredQuantizedEmbedding | None:
    weight = module.weight
    qdata, scale, block = (getattr(weight, name, None) for name in ("qdata", "scale", "block_size"))
    if qdata is None or scale is None or block is None or len(block) != 2 or block[0] != 1:
        return None
    return GatheredQuantizedEmbedding(qdata, scale.reshape(qdata.shape[0], -1), getattr(weight, "zero_point", None),
                                      int(block[1]), weight.dtype)


def gather_quantized_embeddings(model: Any) -> int:
    """Replace every ``nn.Embedding`` of ``model`` whose weight is a row-wise torchao quantized tensor by a
    :class:`GatheredQuantizedEmbedding` (in place); returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Embedding) and child.max_norm is None:
                gathered = _gathered(child)
                if gathered is not None:
                    setattr(parent, name, gathered)
                    replaced += 1
    return replaced
