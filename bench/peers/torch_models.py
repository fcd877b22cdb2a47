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


PRESETS = {"basicnet": BasicNet, "mlp7": MLP7}


def build(name):
    """A fresh model for a tandem preset name; ValueError names the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}: known {', '.join(sorted(PRESETS))}")
    return PRESETS[name]()
