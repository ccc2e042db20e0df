"""Small reference models used by edgeport's tests, benchmarks and the conformance suite.

Each entry of :data:`MODELS` builds ``(module, example_inputs)`` deterministically from a seed. torch is
imported lazily so importing ``edgeport.testing`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _torch() -> Any:
    import torch

    return torch


def simple_conv(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """The seed tutorial's SimpleConv: Conv2d(3, 16, 3, padding=1) + ReLU."""
    torch = _torch()
    torch.manual_seed(seed)

    class SimpleConv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.relu = torch.nn.ReLU()

        def forward(self, x: Any) -> Any:
            return self.relu(self.conv(x))

    return SimpleConv().eval(), (torch.randn(1, 3, 32, 32),)


def add_mul_sin(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """``sin(x) + y * 2``."""
    torch = _torch()
    torch.manual_seed(seed)

    class AddMulSin(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return torch.sin(x) + y * 2

    return AddMulSin().eval(), (torch.randn(3, 4), torch.randn(3, 4))


def two_linear(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """Two Linear layers with a non-delegable op between them (the partitioner example)."""
    torch = _torch()
    torch.manual_seed(seed)

    class TwoLinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.tanh(self.fc1(x)))

    return TwoLinear().eval(), (torch.randn(2, 8),)


def mlp(seed: int = 0, depth: int = 3, width: int = 32) -> tuple[Any, tuple[Any, ...]]:
    """Linear+ReLU stack."""
    torch = _torch()
    torch.manual_seed(seed)
    layers: list[Any] = []
    for i in range(depth):
        layers += [torch.nn.Linear(16 if i == 0 else width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers).eval(), (torch.randn(4, 16),)


def cnn_bn_pool(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """Conv + BatchNorm + ReLU + MaxPool, twice, then AvgPool and a Linear head."""
    torch = _torch()
    torch.manual_seed(seed)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )
    _randomize_bn(model)
    return model.eval(), (torch.randn(2, 3, 16, 16),)


def _randomize_bn(model: Any) -> None:
    torch = _torch()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True) -> Any:
    """Conv2d (no bias, "same" padding for odd ``k``) + BatchNorm2d (+ ReLU6): MobileNetV2's building block."""
    nn = _torch().nn
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


def mobilenet_v2_style(seed: int = 0, resolution: int = 32) -> tuple[Any, tuple[Any, ...]]:
    """A reduced MobileNetV2: stem, inverted residual blocks (expand, depthwise, project, ReLU6), head."""
    torch = _torch()
    torch.manual_seed(seed)
    nn = torch.nn

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            self.use_res = stride == 1 and cin == cout
            self.block = nn.Sequential(
                conv_bn(cin, hidden, 1, 1),
                conv_bn(hidden, hidden, 3, stride, groups=hidden),
                conv_bn(hidden, cout, 1, 1, act=False),
            )

        def forward(self, x: Any) -> Any:
            y = self.block(x)
            return x + y if self.use_res else y

    class MobileNetV2Style(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                conv_bn(3, 16, 3, 2),
                InvertedResidual(16, 16, 1, 1),
                InvertedResidual(16, 24, 2, 6),
                InvertedResidual(24, 24, 1, 6),
                InvertedResidual(24, 32, 2, 6),
                conv_bn(32, 64, 1, 1),
            )
            self.classifier = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            x = self.features(x)
            x = x.mean([2, 3])
            return self.classifier(x)

    model = MobileNetV2Style()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, resolution, resolution),)


def resnet_block(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A ResNet basic block with a strided projection shortcut."""
    torch = _torch()
    torch.manual_seed(seed)
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int = 16, cout: int = 32) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + self.down(x))

    model = BasicBlock()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 16, 16, 16),)


def transformer_encoder_layer(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """``torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, batch_first=True)`` in eval mode."""
    torch = _torch()
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    return layer.eval(), (torch.randn(2, 8, 32),)


MODELS: dict[str, Callable[..., tuple[Any, tuple[Any, ...]]]] = {
    "simple_conv": simple_conv,
    "add_mul_sin": add_mul_sin,
    "two_linear": two_linear,
    "mlp": mlp,
    "cnn_bn_pool": cnn_bn_pool,
    "mobilenet_v2_style": mobilenet_v2_style,
    "resnet_block": resnet_block,
    "transformer_encoder_layer": transformer_encoder_layer,
}


def keyword_spotter(seed: int = 0, classes: int = 12) -> tuple[Any, tuple[Any, ...]]:
    """A DS-CNN-style keyword spotter on a 49x10 MFCC map, the size microcontroller NPUs (Ethos-U55) run."""
    torch = _torch()
    torch.manual_seed(seed)
    nn = torch.nn

    class KeywordSpotter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [nn.Conv2d(1, 16, (10, 4), stride=(2, 2), padding=(5, 1)), nn.BatchNorm2d(16),
                                 nn.ReLU()]
            for _ in range(2):
                layers += [nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU(),
                           nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.ReLU()]
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(16, classes)

        def forward(self, x: Any) -> Any:
            return self.fc(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    model = KeywordSpotter()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 1, 49, 10),)


def resnet_stack(seed: int = 0, blocks: int = 3, width: int = 16, resolution: int = 32) -> tuple[Any, tuple[Any, ...]]:
    """A stem convolution, ``blocks`` ResNet basic blocks (identity shortcuts), global pooling and a classifier."""
    torch = _torch()
    torch.manual_seed(seed)
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(conv_bn(width, width, 3, 1), conv_bn(width, width, 3, 1, act=False))

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + x)

    model = nn.Sequential(conv_bn(3, width, 3, 2), *[Block() for _ in range(blocks)], nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(width, 10))
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, resolution, resolution),)


#: Models of the size embedded NPUs run (not in :data:`MODELS`, which every backend's conformance run uses).
EMBEDDED_MODELS: dict[str, Callable[..., tuple[Any, tuple[Any, ...]]]] = {
    "keyword_spotter": keyword_spotter,
    "resnet_stack": resnet_stack,
}
