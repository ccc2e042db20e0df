"""Full-size vision reference models (MobileNetV2 and ResNet-18 at 224×224), built without torchvision.

The architectures follow the published ones layer for layer (torchvision's definitions): MobileNetV2 with width
multiplier 1.0 (inverted residual settings t, c, n, s below, last channel 1280), ResNet-18 with basic blocks
[2, 2, 2, 2]. Weights are random (seeded); batch-norm statistics are randomized so folding is exercised.
"""

from __future__ import annotations

from typing import Any

from edgeport.testing.models import _randomize_bn, _torch, conv_bn

# expansion t, output channels c, repeats n, first stride s
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                         (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(seed: int = 0, resolution: int = 224, num_classes: int = 1000) -> tuple[Any, tuple[Any, ...]]:
    """MobileNetV2 (1.0×): 17 inverted residual blocks, ReLU6, global average pool, linear classifier."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(seed)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            self.use_res = stride == 1 and cin == cout
            layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, 1)]
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, 1, act=False)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            features = [conv_bn(3, 32, 3, 2)]
            cin = 32
            for t, c, n, s in MOBILENET_V2_SETTINGS:
                for i in range(n):
                    features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            features.append(conv_bn(cin, 1280, 1, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x: Any) -> Any:
            x = self.features(x)
            x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.classifier(x)

    model = MobileNetV2()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, resolution, resolution),)


def resnet18(seed: int = 0, resolution: int = 224, num_classes: int = 1000) -> tuple[Any, tuple[Any, ...]]:
    """ResNet-18: 7×7 stem, max pool, four stages of two basic blocks, global average pool, linear classifier."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(seed)

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + identity)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.layers(self.stem(x))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))

    model = ResNet18()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, resolution, resolution),)


LARGE_MODELS = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}
