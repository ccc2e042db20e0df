"""Formats of ``CoreMLBackend`` blobs: ExecuTorch's flattened model directory (:mod:`.flat_directory`)."""
