"""End to end: programs written by the stock ExecuTorch 1.5.1 (no delegates) run on edgeport's runtime and
match torch eager within 1e-4 (fp32)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("executorch")
torch = pytest.importorskip("torch")

from edgeport.runtime import Runtime  # noqa: E402

pytestmark = pytest.mark.executorch

SMALL = ["addmulsin", "simpleconv", "mlp", "cnn", "mobilenet_small", "resnet_block", "encoder_layer"]
BIG = ["mobilenet_v2", "resnet18", "encoder_4layers"]


def _run_and_compare(zoo, name, tmp_path, atol=1e-4):
    model, inputs, pte = zoo.cached(name)
    path = tmp_path / f"{name}.pte"
    path.write_bytes(pte)
    method = Runtime.get().load_program(path).load_method("forward")
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    for _trial in range(2):  # a second run reuses the planned arenas
        got = method.execute([t.numpy() for t in inputs])
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == tuple(e.shape) and g.dtype == np.float32
            np.testing.assert_allclose(g, e.numpy(), atol=atol, rtol=1e-4)
    return method


@pytest.mark.parametrize("name", SMALL)
def test_executorch_program_matches_eager(zoo, name, tmp_path):
    method = _run_and_compare(zoo, name, tmp_path)
    assert method.profile.runs == 2
    assert set(method.profile.kernel_libraries.values()) == {"portable"}


@pytest.mark.parametrize("name", ["encoder_layer", "cnn"])
def test_constant_folding_changes_nothing(zoo, name):
    _, inputs, pte = zoo.cached(name)
    program = Runtime.get().load_program(pte)
    folded, plain = program.load_method(), program.load_method(fold_constants=False)
    assert folded.profile.folded_instructions > 0 and plain.profile.folded_instructions == 0
    xs = [t.numpy() for t in inputs]
    for a, b in zip(folded.execute(xs), plain.execute(xs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", BIG)
def test_big_executorch_program_matches_eager(zoo, name, tmp_path):
    _run_and_compare(zoo, name, tmp_path, atol=2e-4)


def test_new_inputs_and_torch_tensors(zoo, tmp_path):
    """Fresh inputs each run (not the export example), given as torch tensors (zero-copy conversion)."""
    model, inputs, pte = zoo.cached("cnn")
    method = Runtime.get().load_program(pte).load_method()
    for seed in range(3):
        x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
        (got,) = method.execute([x])
        with torch.no_grad():
            np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4, rtol=1e-4)


class _CatViewSum(torch.nn.Module):
    def forward(self, x, y):
        z = torch.cat([x, y], 0)
        n = z.shape[0]
        return torch.relu(z).view(n, 2, -1).sum(1) * 2 + x.shape[0]


def test_dynamic_shapes_upper_bound(zoo):
    def build():
        from executorch.exir import to_edge
        from torch.export import Dim

        ep = torch.export.export(_CatViewSum(), (torch.randn(3, 4), torch.randn(2, 4)),
                                 dynamic_shapes={"x": {0: Dim("b", max=8)}, "y": None})
        return {"pte": zoo.pte_array(to_edge(ep).to_executorch().buffer)}

    pte = zoo.cached_arrays("dynamic_cat", build)["pte"].tobytes()
    method = Runtime.get().load_program(pte).load_method()
    meta = method.metadata
    assert meta.input_shapes == [(8, 4), (2, 4)] and meta.inputs[0].dynamic
    for b in [3, 1, 8, 5]:
        x, y = torch.randn(b, 4), torch.randn(2, 4)
        (got,) = method.execute([x.numpy(), y.numpy()])
        np.testing.assert_allclose(got, _CatViewSum()(x, y).numpy(), atol=1e-5)
    from edgeport.errors import RuntimeExecutionError

    with pytest.raises(RuntimeExecutionError, match="upper bound"):
        method.execute([np.zeros((9, 4), np.float32), y.numpy()])


def test_multiple_methods_and_metadata(zoo):
    def build():
        from executorch.exir import to_edge

        class A(torch.nn.Module):
            def forward(self, x):
                return x * 2

        class B(torch.nn.Module):
            def forward(self, x):
                return (x + 1, x.to(torch.int32))

        x = torch.randn(2, 3)
        edge = to_edge({"double": torch.export.export(A(), (x,)), "pair": torch.export.export(B(), (x,))})
        return {"pte": zoo.pte_array(edge.to_executorch().buffer)}

    x = torch.randn(2, 3)
    program = Runtime.get().load_program(zoo.cached_arrays("double_pair", build)["pte"].tobytes())
    assert program.method_names == {"double", "pair"}
    meta = program.metadata("pair")
    assert meta.num_inputs() == 1 and meta.num_outputs() == 2
    assert meta.output_dtypes == [np.dtype(np.float32), np.dtype(np.int32)]
    assert meta.input_tensor_meta(0).shape == (2, 3)
    a, b = program.load_method("pair").execute([x.numpy() * 3])
    np.testing.assert_allclose(a, x.numpy() * 3 + 1, rtol=1e-6)
    np.testing.assert_array_equal(b, (x * 3).to(torch.int32).numpy())
    (d,) = program.load_method("double").execute([x.numpy()])
    np.testing.assert_allclose(d, x.numpy() * 2)


def test_ops_of_reference_graphs_have_kernels(zoo):
    """Every op ExecuTorch emits for the reference models has a portable kernel."""
    from edgeport.program.reader import load_pte
    from edgeport.registry import kernel_registry

    ops = set()
    for name in SMALL:
        _, _, pte = zoo.cached(name)
        for plan in load_pte(pte).program.execution_plan:
            ops.update(f"{o.name}.{o.overload}" for o in plan.operators)
    missing = sorted(op for op in ops if kernel_registry().get(op) is None)
    assert not missing


@pytest.mark.parametrize("initialized", [False, True])
@pytest.mark.filterwarnings("ignore:Mutation on a buffer")
def test_mutable_buffer_state_carries_like_executorch(zoo, initialized):
    """A buffer mutated in forward (written back with aten::copy_): state carries across runs exactly as in
    ExecuTorch's own runtime (also with an initial value from the mutable-data segment), and concurrent runs
    take turns."""
    import threading

    x = torch.tensor([1.0, 2.0, 3.0])

    def build():
        from executorch.exir import ExecutorchBackendConfig, to_edge
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
        from executorch.runtime import Runtime as ETRuntime

        class Acc(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("acc", torch.arange(3.0) + 1)

            def forward(self, x):
                self.acc.add_(x)
                return self.acc * 2

        config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["acc"])] if initialized else [])
        pte = to_edge(torch.export.export(Acc(), (x,))).to_executorch(config).buffer
        et = ETRuntime.get().load_program(pte).load_method("forward")
        return {"pte": zoo.pte_array(pte), "et_outputs": np.stack([et.execute([x])[0].numpy() for _ in range(3)])}

    arrays = zoo.cached_arrays(f"mutable_acc_{initialized}", build)
    ours = Runtime.get().load_program(arrays["pte"].tobytes()).load_method()
    for expected in arrays["et_outputs"]:  # three runs of ExecuTorch's runtime
        np.testing.assert_array_equal(ours.execute([x.numpy()])[0], expected)
    threads = [threading.Thread(target=lambda: [ours.execute([x.numpy()]) for _ in range(5)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 3 + 8*5 runs so far, each adding x: the next output is 2 * (initial + 44 * x)
    initial = (torch.arange(3.0) + 1).numpy() if initialized else 0
    np.testing.assert_array_equal(ours.execute([x.numpy()])[0], 2 * (initial + 44 * x.numpy()))


def test_executorch_xnnpack_delegated_program(zoo):
    """A program ExecuTorch lowered to XNNPACK runs here on edgeport-xnnpack's executor (when installed)."""
    pytest.importorskip("edgeport_xnnpack")
    model, inputs = zoo.make_model("mlp")

    def build():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        lowered = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
        return {"pte": zoo.pte_array(lowered.to_executorch().buffer)}

    pte = zoo.cached_arrays("mlp_xnnpack", build)["pte"].tobytes()
    method = Runtime.get().load_program(pte).load_method()
    assert method.metadata.backends == ("XnnpackBackend",)
    (got,) = method.execute([t.numpy() for t in inputs])
    with torch.no_grad():
        np.testing.assert_allclose(got, model(*inputs).numpy(), atol=1e-4, rtol=1e-4)
