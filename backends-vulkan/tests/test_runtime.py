"""VulkanExecutor: validation at init (before any device memory), bad inputs, and a fuzz of mutated blobs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from vk_models import CNN, MLP, load, lower

from edgeport.errors import EdgeportError, ProgramError, RuntimeExecutionError
from edgeport_vulkan.partitioner import VulkanPartitioner
from edgeport_vulkan.preprocess import build_vk_graph
from edgeport_vulkan.runtime import VulkanExecutor
from edgeport_vulkan.schema import OperatorCall, VkTensor, parse_blob, serialize_blob


def _lowered_blob(model, shape) -> bytes:
    from edgeport.program import load_pte

    torch.manual_seed(0)
    return bytes(load_pte(lower(model(), (torch.randn(*shape),), VulkanPartitioner())).delegate_data(0, 0))


@pytest.fixture(scope="module")
def mlp_blob() -> bytes:
    return _lowered_blob(MLP, (2, 8))


def _init(blob: bytes, specs=()):
    ex = VulkanExecutor()
    return ex, ex.init(memoryview(blob), list(specs))


def test_blob_runs_and_reports(device, mlp_blob):
    ex, h = _init(mlp_blob)
    try:
        assert ex.num_outputs(h) == 1 and "Vulkan compute on" in ex.describe_execution(h)
        x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
        out = np.empty((2, 4), np.float32)
        (res,) = ex.execute(h, [x], out=[out])
        assert res is out  # destination passing
        (res2,) = ex.execute(h, [x], out=[None])
        np.testing.assert_array_equal(res2, out)
    finally:
        ex.destroy(h)


def test_unknown_operators_are_named(device, mlp_blob):
    blob = parse_blob(mlp_blob)
    blob.graph.chain.append(OperatorCall(9, "aten.fancy_op.default", [0, 1]))
    blob.graph.chain.append(OperatorCall(10, "et_vk.secret.default", [0, 1]))
    with pytest.raises(ProgramError, match="'aten.fancy_op.default', 'et_vk.secret.default'"):
        _init(serialize_blob(blob.graph, bytes(blob.constant_bytes)))


@pytest.mark.parametrize("mutate, match", [
    (lambda g: g.chain[0].args.__setitem__(0, 999), "outside the graph"),
    (lambda g: setattr(g, "output_ids", [g.input_ids[0]]), "graph input or a constant"),
    (lambda g: setattr(g, "input_ids", []), "read before any operator writes it"),
    (lambda g: g.values[g.input_ids[0]].value.dims.__setitem__(0, 3), "produces|does not match"),
    (lambda g: setattr(g.constants[0], "length", 7), "bytes"),
    (lambda g: setattr(g.constants[0], "offset", 1 << 40), "exceeds"),
    (lambda g: setattr(g.values[g.input_ids[0]].value, "datatype", 3), "float tensors only"),
    (lambda g: setattr(g.values[g.input_ids[0]].value, "datatype", 7), "only FLOAT32 / FLOAT16, INT32 and BOOL"),
    (lambda g: g.chain.append(g.chain[0]), "written twice"),
])
def test_inconsistent_graphs_are_refused_at_init(device, mlp_blob, mutate, match):
    blob = parse_blob(mlp_blob)
    mutate(blob.graph)
    with pytest.raises(ProgramError, match=match):
        _init(serialize_blob(blob.graph, bytes(blob.constant_bytes)))


def test_refusal_allocates_nothing(device, mlp_blob):
    before = len(device._buffers)
    blob = parse_blob(mlp_blob)
    blob.graph.values[blob.graph.output_ids[0]].value = VkTensor(dims=[1, 1])
    with pytest.raises(ProgramError):
        _init(serialize_blob(blob.graph, bytes(blob.constant_bytes)))
    assert len(device._buffers) == before


@pytest.mark.parametrize("blob", [b"", b"\0\0\0\0VH00", b"\0\0\0\0VH01" + bytes(40), b"\x01\0\0\0VH00" + bytes(40)])
def test_bad_headers(blob):
    with pytest.raises(ProgramError):
        parse_blob(blob)


def test_bad_compile_specs(device, mlp_blob):
    from edgeport.backend import CompileSpec

    with pytest.raises(ProgramError, match="unknown compile spec"):
        _init(mlp_blob, [CompileSpec("nope", b"")])


def test_bad_inputs_through_the_runtime(device):
    torch.manual_seed(0)
    method = load(lower(MLP(), (torch.randn(2, 8),), VulkanPartitioner()))
    with pytest.raises(EdgeportError):
        method.execute([np.zeros((3, 8), np.float32)])
    with pytest.raises(EdgeportError):
        method.execute([np.zeros((2, 8), np.float64)])
    with pytest.raises(EdgeportError):
        method.execute([])
    ex, h = _init(serialize_blob(*build_vk_graph(torch.export.export(MLP().eval(), (torch.randn(2, 8),)))))
    try:
        with pytest.raises(RuntimeExecutionError, match="must be float32 of shape"):
            ex.execute(h, [np.zeros((2, 8), np.int32)])
        with pytest.raises(RuntimeExecutionError, match="inputs given"):
            ex.execute(h, [])
        x = np.ones((2, 16), np.float32)[:, ::2]  # non-contiguous input is fine
        assert ex.execute(h, [x])[0].shape == (2, 4)
    finally:
        ex.destroy(h)
    with pytest.raises(RuntimeExecutionError, match="destroyed"):
        ex.execute(h, [np.zeros((2, 8), np.float32)])


_FUZZ = textwrap.dedent("""
    import sys, random
    import numpy as np
    from edgeport.errors import EdgeportError
    from edgeport_vulkan.runtime import VulkanExecutor
    blob = open(sys.argv[1], "rb").read()
    rng = random.Random(int(sys.argv[2]))
    ex = VulkanExecutor()
    refused = ran = 0
    for i in range(int(sys.argv[3])):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 8)):
            kind = rng.random()
            pos = rng.randrange(len(b))
            if kind < 0.6:
                b[pos] = rng.randrange(256)
            elif kind < 0.8:
                del b[pos:pos + rng.randint(1, 16)]
            else:
                b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            h = ex.init(memoryview(bytes(b)), [])
        except (EdgeportError, ValueError) as exc:
            refused += 1
            continue
        try:
            ex.execute(h, [np.ones(tuple(int(d) for d in sys.argv[4].split(",")), np.float32)])
            ran += 1
        except EdgeportError:
            refused += 1
        finally:
            ex.destroy(h)
    print("ok", refused, ran)
""")


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_fuzzed_blobs_never_crash(device, mlp_blob, tmp_path, name):
    """Random byte flips / deletions / insertions: every blob is refused with an edgeport error or runs."""
    blob, shape = (mlp_blob, "2,8") if name == "mlp" else (_lowered_blob(CNN, (1, 3, 8, 8)), "1,3,8,8")
    path = tmp_path / f"{name}.vk"
    path.write_bytes(blob)
    script = tmp_path / "fuzz.py"
    script.write_text(_FUZZ)
    proc = subprocess.run([sys.executable, str(script), str(path), "1234", "400", shape], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok"), proc.stdout + proc.stderr[-3000:]


def test_memory_plan_shares_intermediate_buffers(device):
    from vk_models import Attention, rel_err

    from edgeport_vulkan._plan import plan_graph
    from edgeport_vulkan.runtime import plan_memory

    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(1, 4, 16)
    blob = _lowered_blob(Attention, (1, 4, 16))
    parsed = parse_blob(blob)
    plan = plan_graph(parsed.graph, parsed.constant_bytes, None)
    slots = plan_memory(plan)
    shared = [s for s in slots.values() if s >= 0]
    assert len(set(shared)) < len(shared) / 2  # intermediates reuse a few buffers
    pinned = set(plan.constants) | {plan.storage[v] for v in (*plan.inputs, *plan.outputs)}
    assert all(slots[o] < 0 for o in pinned)  # inputs, outputs and weights keep their own buffers
    # lifetimes of tensors sharing a slot are disjoint
    spans: dict[int, list[tuple[int, int]]] = {}
    for o, s in slots.items():
        uses = [i for i, d in enumerate(plan.dispatches) if any(plan.storage[t] == o for t in d.tensors)]
        if s >= 0:
            spans.setdefault(s, []).append((min(uses), max(uses)))
    for intervals in spans.values():
        intervals.sort()
        assert all(a[1] < b[0] for a, b in zip(intervals, intervals[1:]))
    ex, h = _init(blob)
    try:
        torch.manual_seed(0)
        model = Attention().eval()
        assert rel_err(ex.execute(h, [x.numpy()])[0], model(x).detach().numpy()) <= 1e-4
    finally:
        ex.destroy(h)


def test_graphs_larger_than_device_memory_are_refused(device, mlp_blob, monkeypatch):
    from edgeport_vulkan import runtime

    monkeypatch.setattr(runtime, "_largest_heap", lambda dev: 256)
    before = len(device._buffers)
    with pytest.raises(ProgramError, match="largest memory heap"):
        _init(mlp_blob)
    assert len(device._buffers) == before


def test_force_fp16_blobs_are_written_as_executorch_does(device):
    from edgeport.program import load_pte
    from edgeport_vulkan.options import VulkanCompileOptions
    from edgeport_vulkan.schema import VkDataType

    if not device.info.fp16_storage:
        pytest.skip("the device has no 16-bit storage buffers")
    torch.manual_seed(0)
    pte = lower(MLP(), (torch.randn(2, 8),), VulkanPartitioner(VulkanCompileOptions(force_fp16=True)))
    blob = bytes(load_pte(pte).delegate_data(0, 0))
    g = parse_blob(blob).graph
    tensors = [v.value for v in g.values if isinstance(v.value, VkTensor)]
    assert {t.datatype for t in tensors} == {VkDataType.FLOAT16}
    assert {g.values[i].value.staging_datatype for i in (*g.input_ids, *g.output_ids)} == {VkDataType.FLOAT32}
    assert [c.length for c in g.constants] == [16 * 8 * 2, 16 * 2, 4 * 16 * 2, 4 * 2]
    # a graph mixing FLOAT16 and FLOAT32 tensors is refused
    g.values[g.input_ids[0]].value.datatype = VkDataType.FLOAT32
    with pytest.raises(ProgramError, match="all FLOAT32 or all FLOAT16"):
        _init(serialize_blob(g, bytes(parse_blob(blob).constant_bytes)))


def _mlp_program():
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport_vulkan import VulkanPartitioner

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    pte = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                      partitioner=[VulkanPartitioner()]).to_executorch().buffer
    return model, x, pte


def test_runtime_option_picks_the_device_by_name():
    import numpy as np
    import pytest

    from edgeport.errors import BackendOptionsError, RuntimeExecutionError
    from edgeport.runtime import Runtime
    from edgeport_vulkan.device import VulkanDevice

    model, x, pte = _mlp_program()
    name = VulkanDevice.get().info.name
    program = Runtime.get().load_program(pte)
    method = program.load_method("forward", backend_options={"VulkanBackend": {"device": name.split()[0]}})
    assert name in method.profile.delegates[0].execution
    np.testing.assert_allclose(method.execute([x.numpy()])[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeExecutionError, match="no-such-gpu"):
        program.load_method("forward", backend_options={"VulkanBackend": {"device": "no-such-gpu"}})
    with pytest.raises(BackendOptionsError):
        program.load_method("forward", backend_options={"VulkanBackend": {"device": 3}})


def test_a_driver_error_during_a_run_is_named_and_the_method_stays_usable(monkeypatch):
    """The driver's errors (device lost, out of memory) cannot be provoked on lavapipe; the translation can."""
    import numpy as np
    import pytest

    from edgeport.errors import RuntimeExecutionError
    from edgeport.runtime import Runtime
    from edgeport_vulkan import device as vk_device

    model, x, pte = _mlp_program()
    method = Runtime.get().load_program(pte).load_method("forward")
    real_run = vk_device.Recording.run

    class DeviceLost(Exception):
        pass

    def lost(self):
        raise DeviceLost("VK_ERROR_DEVICE_LOST")

    monkeypatch.setattr(vk_device.Recording, "run", lost)
    with pytest.raises(RuntimeExecutionError, match="device failed during the run.*VK_ERROR_DEVICE_LOST"):
        method.execute([x.numpy()])
    monkeypatch.setattr(vk_device.Recording, "run", real_run)
    np.testing.assert_allclose(method.execute([x.numpy()])[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
