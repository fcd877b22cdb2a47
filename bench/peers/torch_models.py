"""PyTorch twins of tandem's presets, named so their state_dict keys match tandem's safetensors.

Layer names and creation order are a contract: tests copy tandem's flat parameter buffer into
these modules in named_parameters() order and load tandem's safetensors with strict=True, and a
fixed torch.manual_seed gives the same initial weights only while the order stays the same.

Import from a script elsewhere in the tree with
    sys.path.insert(0, os.path.join(<source dir>, "bench", "peers"))"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicNet(nn.Module):
    """basicnet: PyTorch's examples/mnist Net."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class MLP7(nn.Module):
    """mlp7: 784-1024-1024-1024-512-512-256-10, ReLU between, log_softmax out."""

    def __init__(self):
        super().__init__()
        widths = [784, 1024, 1024, 1024, 512, 512, 256, 10]
        for i in range(7):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = torch.flatten(x, 1)
        for i in range(1, 8):
            x = getattr(self, f"fc{i}")(x)
            if i < 7:
                x = F.relu(x)
        return F.log_softmax(x, dim=1)


class MLP(nn.Module):
    """mlp, tandem's tabular baseline: in-128-128-outputs with ReLU between, raw logits out."""

    def __init__(self, in_features=784, outputs=10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, outputs)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def _conv_bn(cin, cout, stride):
    # tandem's resnet-small keeps the conv bias before each batchnorm (src/nn/presets.c)
    return [nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn plus the shortcut (1x1 conv + bn where the shape changes), relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, stride), nn.ReLU(), *_conv_bn(cout, cout, 1))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class ResNetSmall(nn.Module):
    """resnet-small (src/nn/presets.c): conv 16 + bn + relu, one basic block each of 16, 32
    (stride 2) and 64 (stride 2) channels, global average pool, linear; raw logits out. Its
    parameter order is not tandem's: it is a speed twin, not a weight twin (for weights, see
    torch_spec.py on examples/models/resnet-small.yaml)."""

    def __init__(self, in_channels=3, outputs=10):
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(in_channels, 16, 1), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2),
                                    BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, outputs)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


PRESETS = {"basicnet": BasicNet, "mlp7": MLP7}
# built for the data's shape: (input shape [C, H, W] or [features], outputs) -> module
SHAPED = {"mlp": lambda shape, outputs: MLP(int(torch.tensor(shape).prod()), outputs),
          "resnet-small": lambda shape, outputs: ResNetSmall(shape[0], outputs)}


def is_spec(name):
    """tandem's own rule (docs/model-spec.md): a name ending in .yaml/.yml or holding a / is a
    spec file, anything else a preset."""
    return name.endswith((".yaml", ".yml")) or "/" in name


def build(name, in_shape=None, outputs=10):
    """A fresh model for a tandem preset name or a YAML spec's path; ValueError names the known
    presets. basicnet and mlp7 are the MNIST-shaped twins; mlp, resnet-small and specs are built
    for in_shape and outputs."""
    if is_spec(name):
        import yaml
        from torch_spec import SpecNet
        with open(name) as f:
            return SpecNet(yaml.safe_load(f), tuple(in_shape), outputs)
    if name in PRESETS:
        return PRESETS[name]()
    if name in SHAPED:
        if in_shape is None:
            raise ValueError(f"model {name!r} is built for the data's shape: pass in_shape")
        return SHAPED[name](tuple(in_shape), outputs)
    raise ValueError(f"unknown model {name!r}: known {', '.join(sorted(PRESETS) + sorted(SHAPED))}")
