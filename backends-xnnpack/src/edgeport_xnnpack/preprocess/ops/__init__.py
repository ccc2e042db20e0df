"""One module per op family; importing this package fills :data:`~edgeport_xnnpack.preprocess.LOWERINGS`."""

from edgeport_xnnpack.preprocess.ops import (  # noqa: F401
    batch_norm,
    binary,
    cat,
    clamp,
    conv,
    expand,
    layer_norm,
    linear,
    matmul,
    mean,
    pad,
    permute,
    pool,
    reshape,
    resize,
    slice,
    softmax,
    unary,
)
