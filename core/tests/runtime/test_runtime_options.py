"""Runtime options at load (``load_method(..., backend_options=...)``), ``required_backends()`` and ``backends()``.

The example backend declares no runtime options; a backend declared in this file does, with an executor that
keeps what ``init`` received, so the test sees exactly what the runtime passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import edgeport
from edgeport import BackendOptionsError, RuntimeOptions
from edgeport.runtime import Runtime, backends


@pytest.fixture(scope="module")
def example_program() -> bytes:
    from edgeport_example import ExamplePartitioner

    class AddMul(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x + 1.0) * x

    ep = torch.export.export(AddMul(), (torch.randn(3, 4),))
    return edgeport.to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()]).to_executorch().buffer


def test_required_backends_names_what_the_program_calls(example_program):
    (status,) = Runtime.get().load_program(example_program).required_backends()
    assert status.backend_id == "ExampleBackend" and status.installed and status.available, status


def test_backends_lists_every_registered_backend_with_availability():
    listed = {b.backend_id: b for b in backends()}
    assert {s.backend_id for s in edgeport.list_backends()} == set(listed)
    assert listed["ExampleBackend"].available and listed["ExampleBackend"].version
    assert listed["ExampleBackend"].runtime_options == ()


@pytest.mark.parametrize("options, message", [
    ({"NoSuchBackend": {}}, r"'NoSuchBackend', which this program does not use; its delegates use: \['ExampleBackend'\]"),
    ({"ExampleBackend": {"threads": 1}}, r"'ExampleBackend' declares no runtime options"),
    (["ExampleBackend"], r"backend_options must map backend ids to option dicts"),
])
def test_bad_backend_options_are_refused_at_load(example_program, options, message):
    program = Runtime.get().load_program(example_program)
    with pytest.raises(BackendOptionsError, match=message):
        program.load_method("forward", backend_options=options)
    with pytest.raises(BackendOptionsError, match=message):
        edgeport.load(example_program, backend_options=options)


@dataclass
class _Opts(RuntimeOptions):
    scale: float = 1.0
    label: str = ""
    exact: bool = False


@pytest.mark.parametrize("values, message", [
    ({"scale": "2"}, r"'scale' must be float, got str"),
    ({"exact": 1}, r"'exact' must be bool, got int"),
    ({"label": 3}, r"'label' must be str, got int"),
    ({"sclae": 2.0}, r"unknown runtime option 'sclae'; known options: \['exact', 'label', 'scale'\]"),
])
def test_runtime_options_check_names_and_types(values, message):
    with pytest.raises(ValueError, match=message):
        _Opts.from_mapping(values)


def test_runtime_options_accept_ints_for_floats_and_keep_defaults():
    opts = _Opts.from_mapping({"scale": 2})
    assert opts == _Opts(scale=2, label="", exact=False)


def test_options_reach_the_executor_of_each_delegate(example_program):
    """A backend that declares runtime options gets its instance in init; the method profile shows it."""
    from edgeport_example import ExampleExecutor
    from edgeport_example.plugin import BACKEND_ID

    seen: list[object] = []

    class Executor(ExampleExecutor):
        def init(self, processed, compile_specs, runtime_options=None):
            seen.append(runtime_options)
            return super().init(processed, compile_specs)

    spec = edgeport.get_backend(BACKEND_ID)
    original = (spec.executor, spec.runtime_options)
    spec.executor, spec.runtime_options = Executor, _Opts
    try:
        program = Runtime.get().load_program(example_program)
        method = program.load_method("forward", backend_options={BACKEND_ID: {"scale": 0.5, "exact": True}})
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(method.execute([x])[0], (x + 1) * x)
        assert seen and all(o == _Opts(scale=0.5, exact=True) for o in seen)
        assert [d.runtime_options for d in method.profile.delegates] == seen
        seen.clear()
        program.load_method("forward")
        assert seen and all(o is None for o in seen), "no options given: init gets None"
    finally:
        spec.executor, spec.runtime_options = original
