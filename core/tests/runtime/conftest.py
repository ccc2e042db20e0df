"""Fixtures of the runtime tests: a model zoo, ExecuTorch-written programs, and a tiny hand-built program.

Helpers are fixtures (or attributes of fixtures) because tests run with ``--import-mode=importlib``.
The model zoo is also used by ``bench/runtime_latency.py`` (it loads this file by path).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgeport.program import schema as S
from edgeport.program.pte import serialize_pte


# ------------------------------------------------------------------------------------------- model zoo
def model_zoo():
    """name -> (constructor, example-input maker). Imports torch lazily."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class AddMulSin(nn.Module):
        def forward(self, x, y):
            return torch.sin(x + y) * y

    class SimpleConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)

        def forward(self, x):
            return F.relu(self.conv(x))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))

        def forward(self, x):
            return self.net(x)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.b1 = nn.BatchNorm2d(8)
            self.c2 = nn.Conv2d(8, 16, 3, padding=1)
            self.b2 = nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
            x = F.avg_pool2d(F.relu(self.b2(self.c2(x))), 2)
            x = F.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.fc(x)

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hid = cin * expand
            self.use_res = stride == 1 and cin == cout
            layers = []
            if expand != 1:
                layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
            layers += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                       nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        """MobileNetV2's layout (width 1.0); ``small`` keeps only the first stages."""

        def __init__(self, num_classes=1000, small=False):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                   (6, 320, 1, 1)]
            if small:
                cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2)]
            layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
            cin = 32
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            last = 128 if small else 1280
            layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

        def forward(self, x):
            x = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
            return self.classifier(x)

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride=1):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            y = F.relu(self.b1(self.c1(x)))
            return F.relu(self.b2(self.c2(y)) + identity)

    class ResNet18(nn.Module):
        def __init__(self, num_classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                blocks += [BasicBlock(cin, cout, s), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def encoder(layers=1, d=64, heads=4, ff=128):
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        return layer if layers == 1 else nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    return {
        "addmulsin": (AddMulSin, lambda: (torch.randn(2, 3), torch.randn(2, 3))),
        "simpleconv": (SimpleConv, lambda: (torch.randn(1, 3, 16, 16),)),
        "mlp": (MLP, lambda: (torch.randn(4, 32),)),
        "cnn": (CNN, lambda: (torch.randn(2, 3, 16, 16),)),
        "mobilenet_small": (lambda: MobileNetV2(10, small=True), lambda: (torch.randn(1, 3, 32, 32),)),
        "resnet_block": (lambda: BasicBlock(16, 32, 2), lambda: (torch.randn(1, 16, 16, 16),)),
        "encoder_layer": (encoder, lambda: (torch.randn(2, 10, 64),)),
        # benchmark-sized models
        "mobilenet_v2": (MobileNetV2, lambda: (torch.randn(1, 3, 224, 224),)),
        "resnet18": (ResNet18, lambda: (torch.randn(1, 3, 224, 224),)),
        "encoder_4layers": (lambda: encoder(4, 256, 8, 1024), lambda: (torch.randn(1, 128, 256),)),
    }


def make_model(name: str, seed: int = 0):
    """(eval-mode model with randomised batch-norm statistics, example inputs)."""
    import torch

    ctor, make_inputs = model_zoo()[name]
    torch.manual_seed(seed)
    model = ctor().eval()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.5, 0.5)
    return model, make_inputs()


def executorch_pte(model, inputs, dynamic_shapes=None) -> bytes:
    """A portable (no delegate) program written by the stock ExecuTorch."""
    import torch
    from executorch.exir import to_edge

    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return to_edge(ep).to_executorch().buffer


_CACHE = Path(os.environ.get("EDGEPORT_TEST_CACHE", "/tmp/edgeport-runtime-test-cache"))


def cached_executorch_pte(name: str, seed: int = 0):
    """(model, inputs, pte bytes) for a zoo model; the .pte is cached on disk keyed by torch/ExecuTorch versions."""
    import executorch
    import torch

    model, inputs = make_model(name, seed)
    key = hashlib.sha256(f"{name}-{seed}-{torch.__version__}-{getattr(executorch, '__version__', '')}-v1".encode())
    path = _CACHE / f"{name}-{key.hexdigest()[:16]}.pte"
    if path.exists():
        return model, inputs, path.read_bytes()
    data = executorch_pte(model, inputs)
    _CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return model, inputs, data


def cached_executorch_arrays(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``build()`` makes with ExecuTorch (a ``.pte`` as a ``uint8`` array, reference outputs of its
    runtime, ...), cached on disk so that ``executorch.exir`` (~10 s to import) and the export run only when the
    torch or ExecuTorch version, the file defining ``build`` or the model zoo change."""
    from importlib.metadata import version

    key = hashlib.sha256()
    for part in (name, version("torch"), version("executorch"), Path(build.__code__.co_filename).read_bytes(),
                 inspect.getsource(model_zoo)):
        key.update(part if isinstance(part, bytes) else part.encode())
    path = _CACHE / f"{name}-{key.hexdigest()[:16]}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as stored:
            return dict(stored)
    arrays = build()
    _CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return arrays


def pte_array(pte: bytes) -> np.ndarray:
    """A ``.pte`` as an array for :func:`cached_executorch_arrays` (``.tobytes()`` gives it back)."""
    return np.frombuffer(pte, np.uint8)


# ------------------------------------------------------------------------------------------- hand-built programs
class ProgramBuilder:
    """Builds small programs directly from the schema (torch-free): values, constants, kernel calls, one arena."""

    def __init__(self, name: str = "forward") -> None:
        self.name = name
        self.values: list[S.EValue] = []
        self.constants: list[S.Buffer] = [S.Buffer(b"")]
        self.instructions: list[S.Instruction] = []
        self.operators: list[S.Operator] = []
        self.delegates: list[S.BackendDelegate] = []
        self.delegate_data: list[S.BackendDelegateInlineData] = []
        self.arena = 0
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def add(self, val) -> int:
        self.values.append(S.EValue(val))
        return len(self.values) - 1

    def int(self, v: int) -> int:
        return self.add(S.Int(v))

    def double(self, v: float) -> int:
        return self.add(S.Double(v))

    def int_list(self, items) -> int:
        return self.add(S.IntList([self.int(i) for i in items]))

    def tensor(self, shape, dtype=np.float32, dynamic=False) -> int:
        st = S.scalar_type_from_numpy(dtype)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        off = self.arena
        self.arena += (nbytes + 15) // 16 * 16
        return self.add(S.Tensor(scalar_type=st, sizes=list(shape), dim_order=list(range(len(shape))),
                                 allocation_info=S.AllocationDetails.at(1, off),
                                 shape_dynamism=S.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else 0))

    def constant(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        self.constants.append(S.Buffer(array.tobytes()))
        return self.add(S.Tensor(scalar_type=S.scalar_type_from_numpy(array.dtype), sizes=list(array.shape),
                                 dim_order=list(range(array.ndim)), data_buffer_idx=len(self.constants) - 1))

    def op(self, name: str, overload: str, args) -> None:
        key = (name, overload)
        names = [(o.name, o.overload) for o in self.operators]
        if key not in names:
            self.operators.append(S.Operator(name, overload))
            names.append(key)
        self.instructions.append(S.Instruction(S.KernelCall(names.index(key), list(args))))

    def delegate(self, backend_id: str, blob: bytes, args, compile_specs=()) -> None:
        self.delegate_data.append(S.BackendDelegateInlineData(blob))
        self.delegates.append(S.BackendDelegate(
            backend_id, S.BackendDelegateDataReference(S.DataLocation.INLINE, len(self.delegate_data) - 1),
            list(compile_specs)))
        self.instructions.append(S.Instruction(S.DelegateCall(len(self.delegates) - 1, list(args))))

    def plan(self) -> S.ExecutionPlan:
        return S.ExecutionPlan(
            name=self.name, values=self.values, inputs=self.inputs, outputs=self.outputs,
            chains=[S.Chain(inputs=self.inputs, outputs=self.outputs, instructions=self.instructions)],
            operators=self.operators, delegates=self.delegates, non_const_buffer_sizes=[0, self.arena])

    def program(self, extra_plans=()) -> S.Program:
        return S.Program(version=0, execution_plan=[self.plan(), *(b.plan() for b in extra_plans)],
                         constant_buffer=self.constants, backend_delegate_data=self.delegate_data)

    def serialize(self, extra_plans=()) -> bytes:
        assert all(not b.constants[1:] for b in extra_plans), "keep constants in the main builder"
        return serialize_pte(self.program(extra_plans))


def linear_relu_program(w: np.ndarray, b: np.ndarray, batch: int = 2) -> ProgramBuilder:
    """y = relu(x @ w.T + b) written as permute_copy + addmm + relu, as ExecuTorch emits a Linear."""
    pb = ProgramBuilder()
    n_out, n_in = w.shape
    x = pb.tensor((batch, n_in))
    wc, bc = pb.constant(w), pb.constant(b)
    wt = pb.tensor((n_in, n_out))
    pb.op("aten::permute_copy", "out", [wc, pb.int_list([1, 0]), wt, wt])
    h = pb.tensor((batch, n_out))
    pb.op("aten::addmm", "out", [bc, x, wt, pb.int(1), pb.int(1), h, h])
    y = pb.tensor((batch, n_out))
    pb.op("aten::relu", "out", [h, y, y])
    pb.inputs, pb.outputs = [x], [y]
    return pb


@pytest.fixture(scope="session")
def zoo():
    return SimpleNamespace(make_model=make_model, executorch_pte=executorch_pte, cached=cached_executorch_pte,
                           cached_arrays=cached_executorch_arrays, pte_array=pte_array, names=lambda: list(model_zoo()))


@pytest.fixture
def builder():
    return SimpleNamespace(ProgramBuilder=ProgramBuilder, linear_relu=linear_relu_program)
