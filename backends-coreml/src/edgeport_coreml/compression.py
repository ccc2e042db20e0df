"""Post-conversion weight compression of ``CoreMLBackend`` as compile specs (torch-free, coremltools-free).

Two keys, each a JSON object of ``coremltools.optimize.coreml`` config fields, encoded as UTF-8 by ``json.dumps``:

* ``op_linear_quantizer_config`` (ExecuTorch 1.5.1's key and encoding; fields of ``OpLinearQuantizerConfig``):
  ``mode`` (``linear_symmetric`` | ``linear``), ``dtype`` (``int8`` | ``uint8`` | ``int4`` | ``uint4``),
  ``granularity`` (``per_tensor`` | ``per_channel`` | ``per_block``), ``block_size``, ``weight_threshold``;
* ``op_palettizer_config`` (edgeport's key, ExecuTorch has none; fields of ``OpPalettizerConfig``): ``mode``
  (``kmeans`` | ``uniform`` | ``unique``), ``nbits`` (1, 2, 3, 4, 6, 8), ``granularity`` (``per_tensor`` |
  ``per_grouped_channel``), ``group_size``, ``channel_axis``, ``cluster_dim``, ``enable_per_channel_scale``,
  ``weight_threshold``.

``weight_threshold`` (coremltools' default 2048): only weights with more elements are compressed. The deployment
target is checked here, before any conversion: 4-bit and per-block quantization, per-grouped-channel, vector
(``cluster_dim`` > 1), per-channel-scaled and 3-bit palettization need iOS18 / macOS15 (value 9).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["LINEAR_QUANTIZER_KEY", "PALETTIZER_KEY", "check_compression", "decode_config", "encode_config"]

LINEAR_QUANTIZER_KEY = "op_linear_quantizer_config"
PALETTIZER_KEY = "op_palettizer_config"
IOS18 = 9

_LINEAR_FIELDS: dict[str, Any] = {
    "mode": ("linear_symmetric", "linear"),
    "dtype": ("int8", "uint8", "int4", "uint4"),
    "granularity": ("per_tensor", "per_channel", "per_block"),
    "block_size": int,
    "weight_threshold": int,
}
_PALETTE_FIELDS: dict[str, Any] = {
    "mode": ("kmeans", "uniform", "unique"),
    "nbits": (1, 2, 3, 4, 6, 8),
    "granularity": ("per_tensor", "per_grouped_channel"),
    "group_size": int,
    "channel_axis": int,
    "cluster_dim": int,
    "enable_per_channel_scale": bool,
    "weight_threshold": int,
    "num_kmeans_workers": int,
}
_FIELDS = {LINEAR_QUANTIZER_KEY: _LINEAR_FIELDS, PALETTIZER_KEY: _PALETTE_FIELDS}


def _check_fields(key: str, config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ValueError(f"{key} must be a JSON object (a dict of coremltools config fields), got {config!r}")
    fields = _FIELDS[key]
    out: dict[str, Any] = {}
    for name, value in config.items():
        if name not in fields:
            raise ValueError(f"{key}: unknown field {name!r}; known fields: {sorted(fields)}")
        allowed = fields[name]
        if isinstance(allowed, tuple):
            if isinstance(value, bool) or value not in allowed:
                raise ValueError(f"{key}: {name}={value!r} is not one of {list(allowed)}")
        elif allowed is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{key}: {name} must be true or false, got {value!r}")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{key}: {name} must be a non-negative integer, got {value!r}")
        out[name] = value
    if key == PALETTIZER_KEY and out.get("mode", "kmeans") in ("kmeans", "uniform") and "nbits" not in out:
        raise ValueError(f"{key}: mode {out.get('mode', 'kmeans')!r} needs nbits (one of {list(fields['nbits'])})")
    if key == PALETTIZER_KEY and out.get("mode") == "unique" and "nbits" in out:
        raise ValueError(f"{key}: mode 'unique' picks nbits itself; leave nbits out")
    return out


def encode_config(key: str, config: dict[str, Any]) -> bytes:
    """The compile-spec bytes for ``config`` (ExecuTorch's encoding: ``json.dumps`` in UTF-8)."""
    return json.dumps(_check_fields(key, config)).encode("utf-8")


def decode_config(key: str, value: bytes) -> dict[str, Any]:
    """Parse and check one compression compile spec."""
    try:
        config = json.loads(bytes(value).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"compile spec {key!r} is not a JSON object in UTF-8: {exc}") from None
    return _check_fields(key, config)


def _needs_ios18(key: str, config: dict[str, Any]) -> str | None:
    """Why ``config`` needs iOS18 / macOS15, or ``None``."""
    if key == LINEAR_QUANTIZER_KEY:
        if config.get("dtype") in ("int4", "uint4"):
            return f"4-bit ({config['dtype']}) linear quantization"
        if config.get("granularity") == "per_block":
            return "per_block linear quantization"
        return None
    if config.get("granularity") == "per_grouped_channel":
        return "per_grouped_channel palettization"
    if config.get("cluster_dim", 1) > 1:
        return "vector palettization (cluster_dim > 1)"
    if config.get("enable_per_channel_scale"):
        return "palettization with enable_per_channel_scale"
    if config.get("nbits") == 3:
        return "3-bit palettization"
    return None


def check_compression(linear: dict[str, Any] | None, palette: dict[str, Any] | None, target: int) -> None:
    """Refuse a combination the deployment target ``target`` (a ``coremltools.target`` value) cannot run."""
    if linear is not None and palette is not None:
        raise ValueError(f"give either {LINEAR_QUANTIZER_KEY} or {PALETTIZER_KEY}, not both (joint compression "
                         "is not supported by edgeport-coreml)")
    for key, config in ((LINEAR_QUANTIZER_KEY, linear), (PALETTIZER_KEY, palette)):
        if config is None:
            continue
        why = _needs_ios18(key, config)
        if why is not None and target < IOS18:
            raise ValueError(f"{why} needs minimum_deployment_target iOS18/macOS15 (value {IOS18}) or newer; the "
                             f"compile specs ask for value {target}: raise the target or choose an 8-bit "
                             "per-channel / per-tensor scheme")
