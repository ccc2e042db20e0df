"""Named-data keys of what an Ethos-U delegate keeps beside its Vela stream (torch-free).

Both are derived from the delegate's blob (its sha256), so the runtime and ``edgeport inspect`` find them from
the blob alone, and ExecuTorch's runtime, which does not ask for them, ignores them.
"""

from __future__ import annotations

import hashlib


def tosa_key(ethos_u_blob: bytes | memoryview) -> str:
    """Key of the partition's TOSA graph (run on the reference model where no NPU is present)."""
    return "edgeport.arm.tosa." + hashlib.sha256(bytes(ethos_u_blob)).hexdigest()


def estimates_key(ethos_u_blob: bytes | memoryview) -> str:
    """Key of Vela's estimates for the partition (JSON)."""
    return "edgeport.arm.vela." + hashlib.sha256(bytes(ethos_u_blob)).hexdigest()
