"""The conformance suite itself: a correct backend passes it, and each kind of broken backend fails the right test.

One inner pytest session (in-process, like pytester) runs ``BackendConformance`` subclasses over the toy backend
of ``toy_backend.py`` with deliberately broken partitioners and executors; the tests below read its outcomes.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from edgeport import registry

HERE = Path(__file__).parent

INNER = '''
import sys
sys.path.insert(0, {here!r})

import numpy as np
import pytest
import torch

import edgeport
import toy_backend as toy
from edgeport import CapabilityTable, DelegationSpec, OpCapability
from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner
from edgeport.testing import BackendConformance
from edgeport.testing.models import MODELS

for bid, executor in [("ToyBackend", toy.CarefulExecutor), ("ToyLaxBackend", toy.LaxExecutor),
                      ("ToyValueErrorBackend", toy.ValueErrorExecutor)]:
    edgeport.register_plugin(toy.make_plugin(bid, executor), name=bid)

RELU_ONLY = CapabilityTable((OpCapability("aten.relu.default"),))


def relu_neg(seed=0):
    class ReluNeg(torch.nn.Module):
        def forward(self, x):
            return torch.neg(torch.relu(x))
    return ReluNeg(), (torch.randn(3, 4),)


MODELS["toy_relu_neg"] = relu_neg


class Small(BackendConformance):
    models = ()
    max_samples = 1
    capabilities = RELU_ONLY  # one op case per class keeps this fast


class TestGood(Small):
    backend_id = "ToyBackend"
    capabilities = toy.TABLE
    models = ("toy_relu_neg",)


class TestMetaMutating(Small):
    backend_id = "ToyBackend"

    @pytest.fixture
    def partitioner(self):
        class Noting(CapabilityBasedPartitioner):
            def partition(self, ep):
                result = super().partition(ep)
                for node in ep.graph.nodes:
                    node.meta["my_note"] = "x"
                return result
        return Noting("ToyBackend", toy.TABLE)


class TestWrongBackendId(Small):
    backend_id = "ToyBackend"

    @pytest.fixture
    def partitioner(self):
        class Misrouting(CapabilityBasedPartitioner):
            def partition(self, ep):
                result = super().partition(ep)
                result.partition_tags = {{t: DelegationSpec("ToyLaxBackend", []) for t in result.partition_tags}}
                return result
        return Misrouting("ToyBackend", toy.TABLE)


class TestLazyPartitioner(Small):
    backend_id = "ToyBackend"
    capabilities = toy.TABLE

    @pytest.fixture
    def partitioner(self):
        return CapabilityBasedPartitioner("ToyBackend", RELU_ONLY)


class TestGreedyPartitioner(Small):
    backend_id = "ToyBackend"
    models = ("toy_relu_neg",)


class TestLaxExecutor(Small):
    backend_id = "ToyLaxBackend"


class TestValueErrorExecutor(Small):
    backend_id = "ToyValueErrorBackend"


class TestGaps(Small):
    backend_id = "ToyBackend"
    capabilities = CapabilityTable((OpCapability("aten.relu.default"), OpCapability("aten.cumsum.default")))
    known_gaps = {{
        "test_runtime_matches_eager[aten.relu.default-float32-1d]": "pretend this is broken",
        "test_no_such_test[*]": "a stale entry",
    }}


class TestNotInstalled(Small):
    backend_id = "NoSuchBackend"
'''


class Outcomes:
    def __init__(self) -> None:
        self.by_id: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 - pytest hook
        if report.when == "call" or report.outcome != "passed":
            text = report.longreprtext if report.longrepr else ""
            outcome = "xfailed" if getattr(report, "wasxfail", None) is not None and report.skipped else report.outcome
            self.by_id[report.nodeid.split("::", 1)[1]] = (outcome, text)

    def of(self, cls: str, prefix: str = "") -> dict[str, tuple[str, str]]:
        return {k.split("::", 1)[1]: v for k, v in self.by_id.items() if k.startswith(cls + "::" + prefix)}


@pytest.fixture(scope="module")
def inner(tmp_path_factory) -> Outcomes:
    from edgeport.testing.models import MODELS

    root = tmp_path_factory.mktemp("inner")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_toy_conformance.py").write_text(textwrap.dedent(INNER.format(here=str(HERE))))
    outcomes = Outcomes()
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        pytest.main([str(root), "-q", "-p", "no:cacheprovider", "-c", str(root / "pytest.ini"),
                     "--rootdir", str(root), "-W", "ignore"], plugins=[outcomes])
    finally:
        MODELS.pop("toy_relu_neg", None)
        sys.path[:] = saved_path
        for name in ("toy_backend", "test_toy_conformance"):
            if name not in saved_modules:
                sys.modules.pop(name, None)
        registry.reload_plugins()
    return outcomes


def failures(results: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {k: text for k, (outcome, text) in results.items() if outcome == "failed"}


def test_a_correct_backend_passes(inner):
    results = inner.of("TestGood")
    assert len(results) > 20
    assert not failures(results), failures(results)
    assert results["test_runtime_matches_eager[model-toy_relu_neg]"][0] == "passed"
    assert results["test_corrupted_blob_rejected_at_init[version_mismatch]"][0] == "passed"


def test_a_partitioner_that_touches_meta_fails_only_tags(inner):
    failed = failures(inner.of("TestMetaMutating"))
    assert set(failed) == {"test_partitioner_only_tags[aten.relu.default-float32-1d]"}
    assert "meta['my_note'] was added" in failed["test_partitioner_only_tags[aten.relu.default-float32-1d]"]


def test_a_spec_with_another_backend_id_fails_tag_mapping_and_round_trip(inner):
    failed = failures(inner.of("TestWrongBackendId"))
    tag = failed["test_tags_map_to_delegation_specs[aten.relu.default-float32-1d]"]
    assert "backend_id is 'ToyLaxBackend', expected 'ToyBackend'" in tag
    assert "test_program_round_trip[aten.relu.default-float32-1d]" in failed
    assert "test_claimed_nodes_are_delegated[aten.relu.default-float32-1d]" in failed


def test_a_claimed_op_left_untagged_is_reported(inner):
    failed = failures(inner.of("TestLazyPartitioner"))
    assert set(failed) == {"test_claimed_nodes_are_delegated[aten.neg.default-float32-1d]"}
    assert "claims these nodes but the partitioner did not tag them: ['neg (aten.neg.default)']" in \
        failed["test_claimed_nodes_are_delegated[aten.neg.default-float32-1d]"]


def test_delegating_an_unclaimed_op_is_reported(inner):
    failed = failures(inner.of("TestGreedyPartitioner"))
    assert set(failed) == {"test_only_claimed_nodes_are_delegated[model-toy_relu_neg]"}
    assert "neg (aten.neg.default" in failed["test_only_claimed_nodes_are_delegated[model-toy_relu_neg]"]


def test_an_executor_that_accepts_bad_blobs_fails(inner):
    failed = failures(inner.of("TestLaxExecutor"))
    assert "init accepted a bad_magic blob" in failed["test_corrupted_blob_rejected_at_init[bad_magic]"]
    assert "test_corrupted_blob_rejected_at_init[version_mismatch]" in failed
    assert "test_corrupted_blob_in_program_rejected_at_load[version_mismatch]" in failed
    assert not [k for k in failed if "corrupt" not in k]


def test_an_executor_that_raises_a_plain_exception_fails(inner):
    failed = failures(inner.of("TestValueErrorExecutor"))
    text = failed["test_corrupted_blob_rejected_at_init[bad_magic]"]
    assert "init raised ValueError" in text and "edgeport.EdgeportError" in text
    # through the runtime the error is wrapped in a ProgramError, which is what users see
    assert "test_corrupted_blob_in_program_rejected_at_load[bad_magic]" not in failed


def test_known_gaps_are_strict_and_checked_for_staleness(inner):
    results = inner.of("TestGaps")
    outcome, text = results["test_runtime_matches_eager[aten.relu.default-float32-1d]"]
    assert outcome == "failed" and "XPASS(strict)" in text and "pretend this is broken" in text
    outcome, text = results["test_known_gaps_are_current"]
    assert outcome == "failed" and "test_no_such_test[*]" in text


def test_an_op_without_sample_inputs_is_reported_untested(inner):
    outcome, text = inner.of("TestGaps")["test_op_has_sample_inputs[aten.cumsum.default]"]
    assert outcome == "skipped" and "untested: no sample inputs for aten.cumsum.default" in text


def test_a_missing_backend_fails_with_the_registry_message(inner):
    failed = failures(inner.of("TestNotInstalled"))
    assert failed
    assert any("'NoSuchBackend' is not installed" in text for text in failed.values())
