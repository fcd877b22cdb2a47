"""A torch.nn twin of a tandem YAML model spec (docs/model-spec.md), for tests/nn/
test_torch_compare.py (the same weights: values compared) and bench_train.sh's peer (speed).

Parametered modules are registered flat, in forward order, under tandem's layer names (conv1,
bn1, fc2, ...; a spec's name: wins), so named_parameters() walks tandem's flat parameter buffer
in order and state_dict() keys are tandem's safetensors keys. Residual blocks are kept as a
program (a list of steps) that forward() interprets."""
import torch
import torch.nn as nn

PREFIX = {"linear": "fc", "conv2d": "conv", "maxpool2d": "pool", "layernorm": "ln",
          "batchnorm": "bn"}


def _item(item):
    if isinstance(item, str):
        return item, {}
    (kind, args), = item.items()
    return kind, dict(args or {})


class SpecNet(nn.Module):
    def __init__(self, spec, in_shape, outputs):
        super().__init__()
        self.outputs = outputs
        self.counts = {}
        with torch.no_grad():
            self.prog, _ = self._build(spec["layers"], torch.zeros(2, *in_shape))

    def _name(self, kind, args):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return args.get("name") or f"{PREFIX.get(kind, kind)}{self.counts[kind]}"

    def _build(self, items, x):
        prog = []
        for item in items:
            kind, a = _item(item)
            if kind == "residual":
                body, xb = self._build(a["layers"], x)
                short, xs = self._build(a["shortcut"], x) if "shortcut" in a else (None, x)
                self._name(kind, a)  # tandem adds the residual layer after its branches
                prog.append(("residual", body, short))
                x = xb + xs
                continue
            out = a.get("out")
            if out == "outputs":
                out = self.outputs
            name = self._name(kind, a)
            if kind == "linear":
                mod = nn.Linear(x.flatten(1).shape[1], out)
            elif kind == "conv2d":
                mod = nn.Conv2d(x.shape[1], out, a["kernel"], a.get("stride", 1),
                                a.get("padding", 0))
            elif kind == "maxpool2d":
                mod = nn.MaxPool2d(a["kernel"], a.get("stride", a["kernel"]))
            elif kind == "avgpool2d":
                mod = nn.AvgPool2d(a["kernel"], a.get("stride", a["kernel"]))
            elif kind == "global_avgpool":
                mod = nn.AdaptiveAvgPool2d(1)
            elif kind == "layernorm":
                mod = nn.LayerNorm(list(x.shape[1:]), eps=a.get("eps", 1e-5))
            elif kind == "batchnorm":
                cls = nn.BatchNorm1d if x.dim() == 2 else nn.BatchNorm2d
                mod = cls(x.shape[1], eps=a.get("eps", 1e-5), momentum=a.get("momentum", 0.1))
            else:
                mod = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
                       "flatten": nn.Flatten, "log_softmax": lambda: nn.LogSoftmax(1),
                       "dropout": lambda: nn.Dropout(a.get("p", 0.5))}[kind]()
            # parameterless modules too, under names of their own, so train()/eval() reach
            # them (dropout); they add nothing to named_parameters() or state_dict()
            has_params = any(True for _ in mod.parameters())
            setattr(self, name if has_params else f"_stateless{len(self._modules)}", mod)
            prog.append(("layer", mod))
            if kind not in ("layernorm", "batchnorm", "dropout"):  # shape only; no state
                x = mod(x.flatten(1)) if kind == "linear" else mod(x)
        return prog, x

    def _run(self, prog, x):
        for step in prog:
            if step[0] == "residual":
                _, body, short = step
                x = self._run(body, x) + (self._run(short, x) if short else x)
            else:
                mod = step[1]
                x = mod(x.flatten(1)) if isinstance(mod, nn.Linear) else mod(x)
        return x

    def forward(self, x):
        return self._run(self.prog, x).flatten(1)
