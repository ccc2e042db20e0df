"""The benchmark models, their int8 quantization, and their lowering by ExecuTorch (cached) and by edgeport."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
from pathlib import Path
from typing import Any

from .settings import CACHE, ROOT


def _load_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _xnn_zoo() -> Any:
    return _load_module("bench_xnnpack_zoo", ROOT / "backends-xnnpack/tests/xnn_zoo.py")


def build_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(eval model, example inputs); ``mobilenet_v2_int8`` returns the float model (quantized per lowering)."""
    import torch
    from torch import nn

    if name == "mlp":
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1000))
        return model.eval(), (torch.randn(16, 512),)
    if name in ("mobilenet_v2", "mobilenet_v2_int8"):
        return _xnn_zoo().mobilenet_v2(224)
    if name == "resnet18":
        return _xnn_zoo().resnet18(224)
    if name == "encoder":
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        return model.eval(), (torch.randn(1, 128, 256),)
    raise ValueError(name)


def _calibrate(prepared: Any, inputs: tuple[Any, ...]) -> None:
    import torch

    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        prepared(*inputs)
        for _ in range(4):
            prepared(*(torch.randn(x.shape, generator=g) for x in inputs))


def quantize_int8(model: Any, inputs: tuple[Any, ...], quantizer: Any) -> Any:
    """PT2E post-training int8: export, prepare with ``quantizer``, calibrate on 5 batches, convert."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(model, inputs).module()
    prepared = prepare_pt2e(gm, quantizer)
    _calibrate(prepared, inputs)
    return convert_pt2e(prepared)


def _et_quantizer() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def edgeport_quantizer() -> Any:
    """edgeport's int8 XNNPACK quantizer, per-channel weights (ImportError while it does not exist yet)."""
    from edgeport_xnnpack.quantizer import XnnpackQuantizer  # type: ignore[import-not-found]

    return XnnpackQuantizer()


def _cache_key(name: str) -> str:
    from importlib.metadata import version

    h = hashlib.sha256()
    for part in (name, version("torch"), version("executorch"), (ROOT / "backends-xnnpack/tests/xnn_zoo.py").read_bytes(),
                 inspect.getsource(build_model), inspect.getsource(quantize_int8), inspect.getsource(_calibrate),
                 inspect.getsource(_et_quantizer), "v1"):
        h.update(part if isinstance(part, bytes) else part.encode())
    return h.hexdigest()[:16]


def lower_executorch(name: str, model: Any, inputs: tuple[Any, ...], use_cache: bool) -> bytes:
    """ExecuTorch + its XNNPACK partitioner: the .pte bytes, cached in ``CACHE`` by model, versions and code."""
    path = CACHE / f"et-xnnpack-{name}-{_cache_key(name)}.pte"
    if use_cache and path.exists():
        return path.read_bytes()
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as EtXnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower as et_lower

    if name.endswith("_int8"):
        model = quantize_int8(model, inputs, _et_quantizer())
    ep = torch.export.export(model, inputs)
    data = et_lower(ep, partitioner=[EtXnnpackPartitioner()]).to_executorch().buffer
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def lower_edgeport(name: str, model: Any, inputs: tuple[Any, ...], threads: int) -> bytes:
    """edgeport + its XNNPACK partitioner with an executor pool of ``threads``: the .pte bytes (not cached)."""
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner

    if name.endswith("_int8"):
        model = quantize_int8(model, inputs, edgeport_quantizer())
    ep = torch.export.export(model, inputs)
    part = XnnpackPartitioner(XnnpackCompileOptions(num_threads=threads))
    return to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch().buffer
