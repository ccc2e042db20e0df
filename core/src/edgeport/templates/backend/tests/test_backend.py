"""TemplateBackend's own tests, beside the conformance suite: discovery, the blob header, a whole model."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime
from edgeport_template import BACKEND_ID, TemplateExecutor, TemplatePartitioner, __version__, schema


def lower(model, inputs, **partitioner_options):
    ep = torch.export.export(model, inputs)
    return edgeport.to_edge_transform_and_lower(ep, partitioner=[TemplatePartitioner(**partitioner_options)])


def test_discovered_through_its_entry_point():
    spec = edgeport.get_backend(BACKEND_ID)
    assert spec.version == __version__
    assert not [f for f in edgeport.plugin_errors() if "edgeport_template" in str(f)]


def test_model_lowered_with_the_partitioner_runs_on_edgeport_runtime():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.ReLU())
    x = torch.randn(3, 8)
    program = lower(model, (x,)).to_executorch()
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    assert method.metadata.backends == (BACKEND_ID,)
    (out,) = method.execute([x.numpy()])
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_cropping_pad_stays_off_the_backend_with_the_constraints_reason():
    """constant_pad_nd is claimed with edgeport.constraints.non_negative_padding: a crop is refused, a pad runs."""
    def model(x):
        return torch.nn.functional.pad(torch.nn.functional.pad(x, (1, 2, 0, 1), value=0.5), (-1, 0)).relu()

    x = torch.randn(2, 3, 4)
    partitioner = TemplatePartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(_Fn(model), (x,)),
                                                   partitioner=[partitioner]).to_executorch()
    assert any("negative padding (cropping)" in why for why in partitioner.rejections.values())
    (out,) = Runtime.get().load_program(program.buffer).load_method("forward").execute([x.numpy()])
    np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-6, atol=1e-6)


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def blob_of(edge):
    lowered = [m for _, m in edge.exported_program().graph_module.named_children() if hasattr(m, "processed_bytes")]
    return lowered[0].processed_bytes


def test_blob_header_records_versions_and_target():
    class AddBias(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return torch.relu(x + self.bias)

    blob = blob_of(lower(AddBias(), (torch.randn(2, 4),)))
    magic, version, plugin, target, backend, n, d = schema.HEADER.unpack_from(blob, 0)
    assert (magic, version) == (schema.MAGIC, schema.FORMAT_VERSION)
    assert plugin.rstrip(b"\0").decode() == __version__
    assert target.rstrip(b"\0") == b"generic" and backend.rstrip(b"\0").decode() == BACKEND_ID
    assert d == 16 and len(blob) == schema.data_start(n) + d  # the bias is embedded, 16-byte aligned


def test_newer_format_version_is_refused_with_both_versions_named():
    blob = bytearray(blob_of(lower(torch.nn.ReLU(), (torch.randn(3),))))
    struct.pack_into("<I", blob, 4, schema.FORMAT_VERSION + 1)
    with pytest.raises(edgeport.ProgramError, match=r"format version 2 .* reads format version 1"):
        TemplateExecutor().init(memoryview(bytes(blob)), [])
