"""Program–data separation: constants and backends' weights in ``.ptd`` files (ExecuTorch's FlatTensor format).

Oracles: eager PyTorch for the numbers; the stock ExecuTorch 1.5.1 runtime loads edgeport's ``.pte`` + ``.ptd``
(in a child process); ExecuTorch's own ``.pte`` + ``.ptd`` run on edgeport's runtime; ExecuTorch's FlatTensor
reader parses the files edgeport writes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import edgeport
from edgeport import ExecutorchBackendConfig, ProgramError, to_edge, to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport.program.ptd import load_ptd
from edgeport.runtime import Runtime
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.models import cnn_bn_pool, two_linear
from edgeport.testing.stock_runtime import run_program

MODELS = {"two_linear": two_linear, "cnn_bn_pool": cnn_bn_pool}


def _lower(name: str, path: str, tag: str = "weights", seed: int = 0):
    model, example = MODELS[name](seed=seed)
    model.eval()
    ep = torch.export.export(model, example)
    config = ExecutorchBackendConfig(external_constants=lambda node: tag)
    if path == "portable":
        manager = to_edge(ep).to_executorch(config)
    else:
        from edgeport_xnnpack import XnnpackPartitioner

        edgeport.tag_delegate_constants(ep, tag)
        manager = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch(config)
    with torch.no_grad():
        want = model(*example).numpy()
    return manager, example, want


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_weights_live_in_the_ptd_and_edgeport_runs_them(name, path, tmp_path):
    manager, example, want = _lower(name, path)
    assert set(manager.tensor_data) == {"weights"}
    (ptd_path,) = manager.write_tensor_data_to_file(tmp_path)
    assert os.path.basename(ptd_path) == "weights.ptd"
    lp = load_pte(manager.buffer)
    assert lp.num_constants <= 1 and not lp.program.named_data, "no weight is left in the .pte"
    assert len(load_ptd(manager.tensor_data["weights"]).entries) >= 2
    pte = tmp_path / "model.pte"
    manager.save(pte)
    got = Runtime.get().load_program(pte, data_path=ptd_path).load_method("forward").execute(
        [example[0].numpy()])[0]
    _close(got, want)


@pytest.mark.executorch
@pytest.mark.parametrize("path", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_stock_runtime_runs_edgeport_pte_and_ptd(name, path):
    if stock_runtime_missing():
        pytest.skip(stock_runtime_missing())
    manager, example, want = _lower(name, path)
    result = run_program(manager.buffer, list(example), data=manager.tensor_data["weights"], name=f"{name}-{path}")
    assert result.crash is None and result.outputs is not None, f"{result.describe()}\n{result.log}"
    _close(result.outputs[0], want)


@pytest.mark.executorch
@pytest.mark.parametrize("path", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_runs_executorch_pte_and_ptd(name, path, tmp_path):
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig as EtConfig
    from executorch.exir import to_edge as et_to_edge
    from executorch.exir import to_edge_transform_and_lower as et_lower

    model, example = MODELS[name]()
    model.eval()
    if path == "portable":
        manager = et_to_edge(torch.export.export(model, example)).to_executorch(EtConfig(external_constants=True))
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
        from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

        module = torch.export.export(model, example).module()
        delegate_external_constants_pass_unlifted(module, gen_tag_fn=lambda node: "model")
        ep = torch.export.export(module, example)
        manager = et_lower(ep, partitioner=[EtXnnpack()]).to_executorch(EtConfig(external_constants=True))
    manager.write_tensor_data_to_file(str(tmp_path))
    files = sorted(str(p) for p in tmp_path.glob("*.ptd"))
    assert files, "ExecuTorch wrote no .ptd"
    with torch.no_grad():
        want = model(*example).numpy()
    got = Runtime.get().load_program(manager.buffer, data_path=files).load_method("forward").execute(
        [example[0].numpy()])[0]
    _close(got, want)


@pytest.mark.executorch
def test_executorch_reads_the_flat_tensor_edgeport_writes():
    pytest.importorskip("executorch")
    from executorch.extension.flat_tensor.serialize.serialize import (
        FlatTensorHeader,
        _deserialize_to_flat_tensor,
    )

    manager, _, _ = _lower("two_linear", "portable")
    data = manager.tensor_data["weights"]
    header = FlatTensorHeader.from_bytes(data[8:])
    assert header.is_valid()
    theirs = _deserialize_to_flat_tensor(data[:header.flatbuffer_offset + header.flatbuffer_size])
    ours = load_ptd(data, "weights.ptd")
    assert sorted(nd.key for nd in theirs.named_data) == sorted(ours.entries)
    for nd in theirs.named_data:
        seg = theirs.segments[nd.segment_index]
        start = header.segment_base_offset + seg.offset
        assert data[start:start + seg.size] == bytes(ours.entries[nd.key][0])
        assert list(nd.tensor_layout.sizes) == list(ours.entries[nd.key][1].sizes)


class Tuned(torch.nn.Module):
    """A shared trunk and a small head: two fine-tunes differ only in the head."""

    def __init__(self, trunk: torch.nn.Module, head_seed: int) -> None:
        super().__init__()
        self.trunk = trunk
        torch.manual_seed(head_seed)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.trunk(x)))


def test_two_fine_tunes_share_one_ptd_of_the_common_weights(tmp_path):
    torch.manual_seed(0)
    trunk = torch.nn.Linear(64, 32)
    x = torch.randn(2, 64)
    # ExecuTorch's callable gets the constant's placeholder node (lifted parameters are named p_<fqn>)
    tag = lambda node: "trunk" if node.name.startswith("p_trunk_") else None  # noqa: E731
    managers, wants = [], []
    for seed in (1, 2):
        model = Tuned(trunk, seed).eval()
        ep = torch.export.export(model, (x,))
        managers.append(to_edge(ep).to_executorch(ExecutorchBackendConfig(external_constants=tag)))
        with torch.no_grad():
            wants.append(model(x).numpy())
    assert managers[0].tensor_data["trunk"] == managers[1].tensor_data["trunk"], "the shared file is identical"
    (shared,) = managers[0].write_tensor_data_to_file(tmp_path)
    for manager, want in zip(managers, wants):
        got = Runtime.get().load_program(manager.buffer, data_path=shared).load_method("forward").execute([x.numpy()])
        _close(got[0], want)
    heads = [load_pte(m.buffer) for m in managers]
    assert all(len(h.data) < 64 * 32 * 4 for h in heads), "the trunk is not inside either program"


# ------------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def portable_pair():
    manager, example, want = _lower("two_linear", "portable")
    return manager.buffer, manager.tensor_data["weights"], example


def test_missing_ptd_is_refused_with_what_to_do(portable_pair):
    pte, _, _ = portable_pair
    with pytest.raises(ProgramError, match=r"stored outside the program.*data_path="):
        Runtime.get().load_program(pte).load_method("forward")


def test_missing_file_names_the_file(portable_pair, tmp_path):
    pte, _, _ = portable_pair
    with pytest.raises(ProgramError, match=r"cannot read data file .*nope\.ptd"):
        Runtime.get().load_program(pte, data_path=tmp_path / "nope.ptd")


@pytest.mark.parametrize("cut", [10, 60, 200, -1])
def test_truncated_ptd_is_refused(portable_pair, cut):
    pte, data, _ = portable_pair
    with pytest.raises(ProgramError, match=r"data file .*truncated|data file .*too short|data file .*outside"):
        Runtime.get().load_program(pte, data_path=data[:cut])


def test_ptd_of_another_model_names_the_key(portable_pair):
    pte, _, _ = portable_pair
    other, _, _ = _lower("cnn_bn_pool", "portable")
    with pytest.raises(ProgramError, match=r"constant '[\w.]+' is in none of the data files"):
        Runtime.get().load_program(pte, data_path=other.tensor_data["weights"]).load_method("forward")


def test_ptd_with_another_shape_under_the_same_key_is_refused(portable_pair):
    """Same keys, other shapes (another model's weights under the same names): refused naming the key."""
    from edgeport.program.ptd import DataEntry, TensorLayout, serialize_ptd

    pte, data, _ = portable_pair
    entries = {}
    for key, (_, layout) in load_ptd(data).entries.items():
        sizes = [s + 1 for s in layout.sizes]
        entries[key] = DataEntry(bytes(4 * int(np.prod(sizes))), 16,
                                 TensorLayout(layout.scalar_type, sizes, list(layout.dim_order)))
    with pytest.raises(ProgramError, match=r"constant '[\w.]+' in data file .* the \.ptd belongs to another model"):
        Runtime.get().load_program(pte, data_path=serialize_ptd(entries)).load_method("forward")


def test_corrupted_ptd_never_crashes(portable_pair):
    """Flip bytes all over the file: each load runs or raises ProgramError, never a crash or another exception
    (the format has no checksum: flipped weight bytes give other numbers, as they would for ExecuTorch)."""
    pte, data, example = portable_pair
    rng = np.random.default_rng(0)
    for _ in range(200):
        bad = bytearray(data)
        for pos in rng.integers(0, len(bad), size=3):
            bad[pos] ^= int(rng.integers(1, 256))
        try:
            method = Runtime.get().load_program(pte, data_path=bytes(bad)).load_method("forward")
            method.execute([example[0].numpy()])
        except ProgramError:
            pass
