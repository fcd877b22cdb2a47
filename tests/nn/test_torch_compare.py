"""Compares tandem's basicnet and mlp7 with torch.nn on the same weights and inputs: forward
output, NLL loss and every parameter gradient (dropout off; backward still computed), within
float32 tolerance. The tandem side is tests/nn/nn_dump.c, found via TANDEM_BUILD_DIR.

Then the layers added for your own data and models, against twins built from the same YAML
spec by bench/peers/torch_spec.py: the resnet-small preset (batchnorm, residual blocks with
identity and projection shortcuts, global average pool) and tests/nn/specs/mix.yaml (gelu, tanh,
sigmoid, layernorm, batchnorm 1d and 2d, avgpool2d, residual blocks), in training mode (batchnorm
on the batch's statistics; the running statistics after one update are compared with torch's)
and in eval mode; the example specs lenet5.yaml, vgg-cifar.yaml and cifar-net.yaml; and the MSE
and BCE-with-logits losses and their gradients."""
import json
import os
import struct
import subprocess
import sys
import tempfile

# the torch twins of the presets and specs live beside the benchmark peers, which use them too
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench", "peers"))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import yaml
    from torch_models import MLP7, BasicNet
    from torch_spec import SpecNet
except ImportError as e:  # the test machine is meant to have Debian's python3-torch
    print(f"SKIP: torch/numpy not importable ({e}); install python3-torch python3-numpy")
    sys.exit(77)


def compare(name, got, ref, rtol, floor=0.0):
    """max|got - ref| relative to max|ref|, or to floor where that is larger."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.abs(ref).max(), floor, 1e-12)
    err = np.abs(got - ref).max() / scale
    status = "ok" if err <= rtol else "FAIL"
    print(f"  {name:14s} max|diff|/max|ref| = {err:.3e} (tol {rtol:.0e}) {status}")
    return err <= rtol


class NoDevice(Exception):
    pass


def run(model_name, net, batch, build_dir, device="cpu"):
    helper = os.path.join(build_dir, "tests", "nn", "nn_dump")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([helper, model_name, "5", str(batch), d, "2", device],
                           stdout=subprocess.PIPE, text=True)
        print(p.stdout, end="")
        if p.returncode == 77:
            raise NoDevice(p.stdout.strip())
        p.check_returncode()
        load = lambda f, t: np.fromfile(os.path.join(d, f), dtype=t)
        params, grads = load("params.bin", np.float32), load("grads.bin", np.float32)
        x, labels = load("x.bin", np.float32), load("labels.bin", np.int32)
        out, loss = load("out.bin", np.float32), load("loss.bin", np.float64)[0]
    names = [n for n, _ in net.named_parameters()]
    total = sum(p.numel() for p in net.parameters())
    ok = total == params.size
    print(f"{model_name}: {total} torch parameters, {params.size} tandem parameters")
    off = 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(params[off:off + p.numel()].reshape(p.shape)))
            off += p.numel()
    net.eval()  # dropout off, as in nn_dump
    xt = torch.from_numpy(x.reshape(batch, 1, 28, 28))
    yt = torch.from_numpy(labels.astype(np.int64))
    logp = net(xt)
    ref_loss = F.nll_loss(logp, yt)
    ref_loss.backward()
    ok &= compare("output", out, logp.detach().numpy().ravel(), 1e-5)
    ok &= compare("loss", [loss], [ref_loss.item()], 1e-5)
    off = 0
    for n, p in zip(names, net.parameters()):
        ok &= compare(n + ".grad", grads[off:off + p.numel()], p.grad.numpy().ravel(), 1e-4)
        off += p.numel()
    return ok


def parse_safetensors(path):
    """A safetensors file as {name: torch tensor}, read with struct + json + numpy."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def run_spec(model_arg, spec_path, shape, outputs, batch, train, build_dir, device="cpu"):
    """model_arg: what nn_dump loads (a preset or the spec); spec_path: the twin's spec."""
    helper = os.path.join(build_dir, "tests", "nn", "nn_dump")
    dims = ",".join(str(v) for v in shape) + f",{outputs}"
    args = [helper, model_arg, "5", str(batch), None, "2", device, dims]
    args += ["train"] if train else []
    with tempfile.TemporaryDirectory() as d:
        args[4] = d
        p = subprocess.run(args, stdout=subprocess.PIPE, text=True)
        print(p.stdout, end="")
        p.check_returncode()
        load = lambda f, t: np.fromfile(os.path.join(d, f), dtype=t)
        params, grads = load("params.bin", np.float32), load("grads.bin", np.float32)
        x, labels = load("x.bin", np.float32), load("labels.bin", np.int32)
        out, loss = load("out.bin", np.float32), load("loss.bin", np.float64)[0]
        target = load("target.bin", np.float32)
        mse, bce = load("mse.bin", np.uint8), load("bce.bin", np.uint8)
        buffers = load("buffers.bin", np.float32) if train else None
        saved = parse_safetensors(os.path.join(d, "model.safetensors")) if train else None
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    net = SpecNet(spec, shape, outputs)
    total = sum(p.numel() for p in net.parameters())
    mode = "train" if train else "eval"
    print(f"{model_arg} ({mode}, twin from {os.path.basename(spec_path)}): {total} torch "
          f"parameters, {params.size} tandem parameters")
    ok = total == params.size
    if not ok:
        return False
    off = 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(params[off:off + p.numel()].reshape(p.shape)))
            off += p.numel()
    net.train(train)
    xt = torch.from_numpy(x.reshape(batch, *shape))
    outt = net(xt)
    ref_loss = F.nll_loss(outt, torch.from_numpy(labels.astype(np.int64)))
    ref_loss.backward()
    ok &= compare("output", out, outt.detach().numpy().ravel(), 1e-5)
    ok &= compare("loss", [loss], [ref_loss.item()], 1e-5)
    # A bias whose shift a training-mode batchnorm later removes (every bias before one, and in
    # mix.yaml more) has a gradient that is exactly 0 in exact arithmetic: both sides give
    # rounding noise, so such a tensor (below 1e-3 of the model's largest gradient in torch) must
    # stay within 1e-5 of that largest gradient instead.
    gmax = max(p.grad.abs().max().item() for p in net.parameters())
    off = 0
    for n, p in net.named_parameters():
        ref = p.grad.numpy().ravel()
        if np.abs(ref).max() < 1e-3 * gmax:
            ok &= compare(n + ".grad~0", grads[off:off + p.numel()], ref, 1e-5, gmax)
        else:
            ok &= compare(n + ".grad", grads[off:off + p.numel()], ref, 1e-4)
        off += p.numel()
    if train:  # torch updated its running statistics in the forward; tandem once, explicitly
        ref = np.concatenate([b.numpy().ravel() for n, b in net.named_buffers()
                              if n.endswith("running_mean") or n.endswith("running_var")])
        ok &= compare("running stats", buffers, ref, 1e-5)
        # tandem's safetensors (after the same one update) loads into the twin with strict=True:
        # every key, shape and dtype of torch's state_dict, the running statistics included
        want = {k: (tuple(v.shape), v.dtype) for k, v in net.state_dict().items()}
        got = {k: (tuple(v.shape), v.dtype) for k, v in saved.items()}
        if want != got:
            print(f"  safetensors keys/shapes differ from the state_dict:\n    "
                  f"tandem {sorted(set(got.items()) - set(want.items()))}\n"
                  f"    torch  {sorted(set(want.items()) - set(got.items()))}")
            return False
        fresh = SpecNet(spec, shape, outputs)
        fresh.load_state_dict(saved, strict=True)
        sd = fresh.state_dict()
        flat = np.concatenate([p.detach().numpy().ravel() for p in fresh.parameters()])
        ok &= compare("saved params", flat, params, 0.0)
        tracked = {k: int(v) for k, v in sd.items() if k.endswith("num_batches_tracked")}
        print(f"  safetensors: {len(saved)} tensors load with strict=True; "
              f"num_batches_tracked {sorted(set(tracked.values()))}")
        ok &= set(tracked.values()) == {1} and len(tracked) > 0
        ok &= compare("saved buffers", np.concatenate(
            [v.numpy().ravel() for k, v in sd.items() if k.endswith(("running_mean", "running_var"))]),
            buffers, 0.0)
    # losses on tandem's own output, so only the loss differs
    o = torch.from_numpy(out.reshape(batch, outputs)).requires_grad_()
    t = torch.from_numpy(target.reshape(batch, outputs))
    for name, raw, fn in (("mse", mse, F.mse_loss), ("bce_logits", bce,
                                                      F.binary_cross_entropy_with_logits)):
        o.grad = None
        ref = fn(o, t)
        ref.backward()
        ok &= compare(name, [raw[:8].view(np.float64)[0]], [ref.item()], 1e-6)
        ok &= compare(name + ".grad", raw[8:].view(np.float32), o.grad.numpy().ravel(), 1e-5)
    return ok


def main(device="cpu"):
    """device: which tandem engine to compare (cuda: tests/gpu/test_gpu_torch.py)."""
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set (run through ctest)")
        return 1
    torch.set_num_threads(1)
    try:
        ok = run("basicnet", BasicNet(), 18, build_dir, device)  # 18: a partial last chunk
        ok &= run("mlp7", MLP7(), 32, build_dir, device)
    except NoDevice as e:
        print(e)
        return 77
    # the layers of the user's models, on either engine
    here = os.path.dirname(os.path.abspath(__file__))
    resnet = os.path.join(SOURCE_DIR, "examples", "models", "resnet-small.yaml")
    mix = os.path.join(here, "specs", "mix.yaml")
    tabular = os.path.join(SOURCE_DIR, "examples", "models", "tabular.yaml")
    torch.manual_seed(0)
    ok &= run_spec("resnet-small", resnet, (3, 16, 16), 10, 10, True, build_dir, device)
    # odd planes (143, 42, 12 values): batchnorm's lane sums end in a partial row of lanes,
    # and Winograd's padded planes have odd widths
    ok &= run_spec("resnet-small", resnet, (3, 13, 11), 10, 9, True, build_dir, device)
    ok &= run_spec(mix, mix, (2, 8, 8), 7, 11, True, build_dir, device)
    ok &= run_spec(mix, mix, (2, 8, 8), 7, 11, False, build_dir, device)
    # tabular has dropout: compared in eval mode only (masks are tandem's own)
    ok &= run_spec(tabular, tabular, (20, 1, 1), 3, 9, False, build_dir, device)
    # the example specs a user starts from: LeNet-5 (5x5 convs, tanh, 2x2 average pooling; no
    # batchnorm or dropout, so eval mode is the training step) and the CIFAR tutorials' CNN
    # (batchnorm, 2x2 max pooling; dropout, so eval mode), and PyTorch's own tutorial network
    # (5x5 convs of 6 and 16 channels: both read in place by the implicit gemm, the second's
    # input gradient through col2im)
    lenet = os.path.join(SOURCE_DIR, "examples", "models", "lenet5.yaml")
    vgg = os.path.join(SOURCE_DIR, "examples", "models", "vgg-cifar.yaml")
    cifar_net = os.path.join(SOURCE_DIR, "examples", "models", "cifar-net.yaml")
    ok &= run_spec(lenet, lenet, (1, 28, 28), 10, 9, False, build_dir, device)
    ok &= run_spec(vgg, vgg, (3, 32, 32), 10, 6, False, build_dir, device)
    ok &= run_spec(cifar_net, cifar_net, (3, 32, 32), 10, 7, False, build_dir, device)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
