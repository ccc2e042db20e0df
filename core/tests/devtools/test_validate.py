"""edgeport.devtools.validate: per-partition numerical validation and bisect, checked against eager PyTorch."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

import edgeport
from edgeport.backend import BackendSpec, DelegationSpec
from edgeport.devtools.validate import bisect, validate, validate_program

pytest.importorskip("edgeport_example")
from edgeport_example import ExamplePartitioner  # noqa: E402
from edgeport_example.plugin import _preprocess as example_preprocess  # noqa: E402
from edgeport_example.runtime import ExampleExecutor, _resolve  # noqa: E402

BROKEN_ID = "BrokenExampleBackend"


class Chain(torch.nn.Module):
    """Three ExampleBackend partitions (linear+relu | linear+sin | linear+mul) split by CPU ops (tanh, exp)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(torch.relu(self.a(x)))
        y = torch.exp(torch.sin(self.b(y)))
        return self.c(y) * y[:, :4]


def _chain() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Chain().eval(), (torch.randn(2, 8),)


def _sqnr(out: np.ndarray, ref: np.ndarray) -> float:
    """Independent SQNR (dB) of ``out`` against ``ref``."""
    noise = float(np.sum((out.astype(np.float64) - ref.astype(np.float64)) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


def _lower(model: torch.nn.Module, args: tuple, partitioners: list) -> Any:
    return edgeport.to_edge_transform_and_lower(torch.export.export(model, args), partitioner=partitioners)


@pytest.fixture(scope="module")
def chain_em() -> Any:
    """The chain lowered to ExampleBackend (validate and bisect only read it)."""
    model, args = _chain()
    return _lower(model, args, [ExamplePartitioner()])


# -- a deliberately broken backend: ExampleBackend whose executor adds 1.0 to every sin ------------------------
class BrokenExecutor(ExampleExecutor):
    """Runs ExampleBackend blobs, but each ``aten.sin`` result is off by +1.0; exposes per-node values."""

    def _run(self, handle: Any, inputs: list) -> dict[str, np.ndarray]:
        env: dict[str, Any] = dict(handle.constants)
        env.update(zip(handle.inputs, (np.asarray(x) for x in inputs), strict=True))
        for node in handle.nodes:
            value = np.asarray(node.kernel(*(_resolve(a, env) for a in node.args)))
            env[node.output] = value + np.float32(1.0) if node.op == "aten.sin.default" else value
        return {n.output: env[n.output] for n in handle.nodes}

    def execute(self, handle: Any, inputs: list) -> list[np.ndarray]:
        values = self._run(handle, inputs)
        return [np.array(values[name]) for name in handle.outputs]

    def intermediate_outputs(self, handle: Any, inputs: list) -> dict[str, np.ndarray]:
        return self._run(handle, inputs)


class SinToBroken(ExamplePartitioner):
    """ExamplePartitioner, but partitions holding a ``sin`` go to the broken backend."""

    def partition(self, exported_program: Any) -> Any:
        result = super().partition(exported_program)
        tags = {n.meta.get("delegation_tag") for n in exported_program.graph.nodes
                if n.op == "call_function" and n.target is torch.ops.aten.sin.default}
        for tag in tags & set(result.partition_tags):
            spec = result.partition_tags[tag]
            result.partition_tags[tag] = DelegationSpec(BROKEN_ID, list(spec.compile_specs))
        return result


class BrokenPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry: Any) -> None:
        registry.add(BackendSpec(backend_id=BROKEN_ID, version="0", preprocess=example_preprocess,
                                 executor=BrokenExecutor, description="test only: sin results off by +1"))


@pytest.fixture
def broken_backend():
    plugin = BrokenPlugin()
    edgeport.register_plugin(plugin, name="broken-example-test")
    yield
    edgeport.unregister_plugin(plugin)


# -- ExampleBackend ----------------------------------------------------------------------------------------
def test_example_backend_partitions_match_eager(chain_em):
    model, args = _chain()
    em = chain_em
    samples = [args, (torch.randn(2, 8),)]
    report = validate(em, samples)
    assert report.passed and report.samples == 2
    assert [p.backend_id for p in report.partitions] == ["ExampleBackend"] * 3
    assert [p.index for p in report.partitions] == [0, 1, 2]
    assert report.partitions[0].ops == {"aten.linear.default": 1, "aten.relu.default": 1}
    assert report.partitions[1].output_shapes == [[2, 8]]
    # independent oracle: the original nn.Module in eager torch vs edgeport's runtime on the .pte
    pte = em.to_executorch().buffer
    method = edgeport.runtime.Runtime.get().load_program(pte).load_method("forward")
    for s in samples:
        got = method.execute([s[0].numpy()])[0]
        ref = model(*s).detach().numpy()
        assert np.abs(got - ref).max() <= 1e-5
    assert report.whole.max_abs <= 1e-5 and report.whole.sqnr_db > 100
    for p in report.partitions:
        assert p.stats.sqnr_db > 100 and p.stats.max_abs <= 1e-5 and p.stats.max_rel <= 1e-5
        assert p.worst_node == "n/a: ExampleBackend exposes no intermediates"
    table = report.format()
    assert "whole program" in table and "ExampleBackend exposes no intermediates" in table
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is True and len(data["partitions"]) == 3
    assert bisect(em, args) is None


def test_bisect_names_exactly_the_broken_partition(broken_backend):
    model, args = _chain()
    em = _lower(model, args, [SinToBroken()])
    report = validate(em, args)
    assert [p.backend_id for p in report.partitions] == ["ExampleBackend", BROKEN_ID, "ExampleBackend"]
    found = bisect(em, args)
    assert found is not None and found.index == 1 and found.backend_id == BROKEN_ID
    assert "aten.sin.default" in found.ops
    # the broken partition is off by exactly 1.0 everywhere; its oracle: the eager sin(linear(tanh(relu(a(x)))))
    with torch.no_grad():
        h = torch.tanh(torch.relu(model.a(args[0])))
        ref = torch.sin(model.b(h)).numpy()
    assert found.stats.max_abs == pytest.approx(1.0, abs=1e-5)
    assert found.stats.max_rel == pytest.approx(1.0 / np.abs(ref).max(), rel=1e-4)
    assert found.stats.sqnr_db == pytest.approx(_sqnr(ref + 1.0, ref), abs=1e-3)
    # fed the reference inputs, the partition after it is exact: the error does not accumulate
    assert not report.passed and not report.whole_passed
    assert report.partitions[2].passed and report.partitions[2].stats.sqnr_db > 100
    assert report.first_failing is not None and report.first_failing.index == 1
    assert report.worst is not None and report.worst.index == 1
    # the broken backend exposes intermediates: the worst node is the corrupted sin
    assert found.worst_node.startswith("sin") and found.worst_node_stats is not None
    assert found.worst_node_stats.max_abs == pytest.approx(1.0, abs=1e-5)
    assert "first diverging partition: 1" in report.format()


# -- XNNPACK ------------------------------------------------------------------------------------------------
class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(y)


class TwoConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).flatten(1))


def test_xnnpack_fp32_and_int8():
    xnn = pytest.importorskip("edgeport_xnnpack")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, args = ConvNet().eval(), (torch.randn(1, 3, 8, 8),)
    em = _lower(model, args, [xnn.XnnpackPartitioner()])
    pte = em.to_executorch().buffer
    report = validate(em, args, pte=pte)
    assert report.passed and report.partitions
    assert all(p.backend_id == "XnnpackBackend" for p in report.partitions)
    assert all(p.worst_node == "n/a: XnnpackBackend exposes no intermediates" for p in report.partitions)
    ref = model(*args).detach().numpy()
    got = edgeport.runtime.Runtime.get().load_program(pte).load_method().execute([args[0].numpy()])[0]
    assert report.whole.sqnr_db == pytest.approx(_sqnr(got, ref), abs=0.5) and report.whole.sqnr_db > 80

    model = TwoConv().eval()
    prepared = prepare_pt2e(torch.export.export(model, args).module(), xnn.XnnpackQuantizer(observer="minmax"))
    for _ in range(4):
        prepared(torch.randn(1, 3, 8, 8))
    quantized = convert_pt2e(prepared)
    qem = _lower(quantized, args, [xnn.XnnpackPartitioner()])
    qreport = validate(qem, args)
    ops = {op for p in qreport.partitions for op in p.ops}
    assert any("quantize_per" in op for op in ops), ops  # judged against its own q/dq subgraph
    assert qreport.passed, qreport.format()
    # oracle: the pt2e-quantized torch model itself (int8 rounding: close, not exact)
    qref = quantized(*args).detach().numpy()
    qgot = edgeport.runtime.Runtime.get().load_program(qem.to_executorch().buffer).load_method().execute(
        [args[0].numpy()])[0]
    assert qreport.whole.sqnr_db == pytest.approx(_sqnr(qgot, qref), abs=0.01) and 25 < qreport.whole.sqnr_db
    assert qreport.whole.max_abs == pytest.approx(float(np.abs(qgot - qref).max()), rel=1e-6)


def test_bert_tiny_on_xnnpack():
    xnn = pytest.importorskip("edgeport_xnnpack")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 100, (1, 8))
    em = _lower(Wrapped().eval(), (ids,), [xnn.XnnpackPartitioner()])
    pte = em.to_executorch().buffer
    report = validate(em, (ids,), pte=pte)
    assert report.partitions and report.passed, report.format()
    with torch.no_grad():
        ref = model(input_ids=ids).last_hidden_state.numpy()
    got = edgeport.runtime.Runtime.get().load_program(pte).load_method().execute([ids.numpy()])[0]
    assert report.whole.sqnr_db == pytest.approx(_sqnr(got, ref), abs=0.5)


# -- bad input ----------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_input_and_expected_shape(chain_em):
    em, args = chain_em, _chain()[1]
    with pytest.raises(ValueError, match=r"input 0 \('x'\): expected shape \[2, 8\] float32, got shape \[3, 8\]"):
        validate(em, (torch.randn(3, 8),))
    with pytest.raises(ValueError, match=r"expected shape \[2, 8\] float32, got shape \[2, 8\] float64"):
        validate(em, (torch.randn(2, 8, dtype=torch.float64),))
    with pytest.raises(ValueError, match=r"expected 1 inputs \(x \(shape \[2, 8\] float32\)\), got 2"):
        bisect(em, (torch.randn(2, 8), torch.randn(2, 8)))
    with pytest.raises(ValueError, match="non-empty list"):
        validate(em, [])
    with pytest.raises(TypeError, match="EdgeProgramManager"):
        validate(em.to_executorch(), args)


def test_dynamic_batch_within_and_outside_its_bounds():
    model, args = _chain()
    batch = torch.export.Dim("batch", min=1, max=8)
    em = edgeport.to_edge_transform_and_lower(torch.export.export(model, args, dynamic_shapes=({0: batch},)),
                                              partitioner=[ExamplePartitioner()])
    samples = [(torch.randn(2, 8),), (torch.randn(5, 8),)]
    report = validate(em, samples, pte=em.to_executorch())
    assert report.passed and len(report.partitions) == 3
    with torch.no_grad():  # the reference the report used is the model's own output, for both batch sizes
        ref_max = max(float(model(*s).abs().max()) for s in samples)
    assert report.whole.ref_max_abs == pytest.approx(ref_max, rel=1e-6)
    assert report.partitions[0].input_shapes == [[2, 8]]
    with pytest.raises(ValueError, match=r"input 0 \('x'\): expected shape \[\w+ in \[1, 8\], 8\] float32, "
                                         r"got shape \[9, 8\]"):
        validate(em, (torch.randn(9, 8),))


def test_program_without_delegates_has_the_whole_program_row_only():
    model, args = _chain()
    em = _lower(model, args, [])
    report = validate(em, args)
    assert report.partitions == [] and report.worst is None and report.passed
    assert any("calls no delegate" in n for n in report.notes)
    assert report.whole.max_abs <= 1e-5


def test_validate_program_against_the_module(chain_em):
    model, args = _chain()
    pte = chain_em.to_executorch().buffer
    report = validate_program(pte, model, args)
    assert report.passed and report.partitions == [] and report.whole.sqnr_db > 100
    wrong = validate_program(pte, lambda x: model(x) + 0.5, args)
    assert not wrong.passed and wrong.whole.max_abs == pytest.approx(0.5, abs=1e-5)
    with pytest.raises(ValueError, match=r"input 0: expected shape \[2, 8\] float32, got shape \[4, 8\]"):
        validate_program(pte, model, (torch.randn(4, 8),))


# -- the command line ---------------------------------------------------------------------------------------
REFERENCE = '''
import torch
from edgeport_example import ExamplePartitioner


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.tanh(torch.relu(self.a(x)))
        y = torch.exp(torch.sin(self.b(y)))
        return self.c(y) * y[:, :4]


def model():
    torch.manual_seed(0)
    return Chain().eval(), (torch.randn(2, 8),)


def with_partitioners():
    m, args = model()
    return m, args, [ExamplePartitioner()]


def not_lowered():
    m, args = model()
    return m, args, []


def off_by_half():
    m, args = model()
    return (lambda x: m(x) + 0.5), args


def broken():
    raise RuntimeError("no weights here")
'''


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory, chain_em):
    from edgeport.cli import main

    tmp_path = tmp_path_factory.mktemp("validate_cli")
    (tmp_path / "ref.py").write_text(REFERENCE)
    pte = tmp_path / "chain.pte"  # chain_em: the same seed and module as REFERENCE's model()
    pte.write_bytes(chain_em.to_executorch().buffer)

    def run(*argv: str) -> int:
        return main(["validate", str(pte), *argv])

    return tmp_path, run


def test_cli_whole_program_and_partitions(cli_files, capsys):
    tmp, run = cli_files
    assert run("--reference", f"{tmp}/ref.py:model") == 0
    out = capsys.readouterr().out
    assert "whole program" in out and "per-partition rows need the lowered program" in out
    assert run("--reference", f"{tmp}/ref.py:with_partitioners", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and [p["backend_id"] for p in data["partitions"]] == ["ExampleBackend"] * 3
    assert run("--reference", f"{tmp}/ref.py:not_lowered") == 0  # the file's delegates differ: said so
    assert "the lowered reference has delegates [], " in capsys.readouterr().out
    assert run("--reference", f"{tmp}/ref.py:off_by_half") == 1
    assert "FAIL" in capsys.readouterr().out
    x = torch.randn(2, 8)
    np.savez(tmp / "x.npz", x.numpy())
    assert run("--reference", f"{tmp}/ref.py:model", "--inputs", str(tmp / "x.npz"), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    model, _ = _chain()
    assert data["whole_program"]["ref_max_abs"] == pytest.approx(float(model(x).detach().abs().max()), rel=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--reference", "{tmp}/nope.py:model"], "no file"),
    (["--reference", "no_such_module_xyz:model"], "cannot import 'no_such_module_xyz'"),
    (["--reference", "{tmp}/ref.py:missing"], "has no callable 'missing'"),
    (["--reference", "{tmp}/ref.py"], "must look like pkg.module:factory"),
    (["--reference", "{tmp}/ref.py:broken"], "the factory raised RuntimeError: no weights here"),
    (["--reference", "{tmp}/ref.py:model", "--inputs", "{tmp}/missing.npz"], "cannot read"),
    (["--reference", "{tmp}/ref.py:model", "--inputs", "{tmp}/bad.npz"], r"expected shape [2, 8] float32"),
])
def test_cli_bad_input_exits_2_with_one_line(cli_files, capsys, argv, message):
    tmp, run = cli_files
    np.savez(tmp / "bad.npz", np.zeros((3, 8), np.float32))
    assert run(*[a.format(tmp=tmp) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeport validate: ") and message in err and len(err.strip().splitlines()) == 1


def test_cli_missing_program(tmp_path, capsys):
    from edgeport.cli import main

    assert main(["validate", str(tmp_path / "none.pte"), "--reference", "x:y"]) == 2
    assert "cannot read" in capsys.readouterr().err
