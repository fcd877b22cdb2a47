"""PyTorch peer on CUDA for bench_gpu.sh: BasicNet or mlp7 on Fashion-MNIST, or resnet-small on
CIFAR-shaped images (--npy), with the data resident on the GPU, AdamW lr 1e-3, at three
precisions. Prints one JSON line per measurement.

Precisions (--precision, every JSON line says which in "precision"):
  fp32  plain fp32: TF32 off for matmuls and cuDNN convolutions.
  tf32  fp32 storage, TF32 tensor-core matmuls and convolutions.
  bf16  torch.autocast(dtype=torch.bfloat16, cache_enabled=False) around forward + loss (the
        gemms and convolutions take bf16 operands and accumulate in fp32; autocast keeps
        log_softmax and the loss in fp32), backward outside it as PyTorch prescribes; fp32 master
        weights, gradients and AdamW state; no GradScaler (bf16 has fp32's exponent range). TF32
        stays off, so any matmul that autocast leaves in fp32 is plain fp32.
  TF32 is set with torch.backends.cuda.matmul / cudnn.conv .fp32_precision ("ieee" or "tf32")
  where this PyTorch has that API (2.7 on; the legacy allow_tf32 flags warn from 2.9 and must not
  be mixed with it), else with the legacy allow_tf32 flags.

  throughput (default): --model M[,M..] --batch B[,B..] --precision P[,P..]
      --mode eager|graph[,..] --steps N[,N..] --warmup W[,W..]
      every combination, in that order (model, batch, precision, mode); W untimed steps, then N
      steps timed between two torch.cuda.synchronize() calls; --steps and --warmup take one value
      for every batch or one per batch, in --batch's order:
      {"peer": "torch", "model", "batch", "precision", "mode", "samples_per_s", "step_us", ...}
      eager: gather (index_select by a slice of a GPU random permutation), forward, loss,
             backward, optimizer.step, one kernel launch at a time.
      graph: that whole step captured in one CUDA graph (torch.cuda.graph after warm-up on a side
             stream, PyTorch's "whole network capture"; bf16's autocast is entered inside the
             capture, with its cast cache off as capture requires); the batch's index tensor is a
             static tensor refilled from the permutation before each replay; AdamW
             capturable=True.
  --time-to-acc T [--epochs E] [--precision P]   eager training, epochs of 60000 samples (the
      tail batch kept), test accuracy on the GPU after each epoch, stop at the first >= T percent
      (at most E epochs, default 3): {"peer": "torch", "time_to_acc_s", "acc": [per-epoch %],
      "epoch_wall_s", ...}; the time excludes loading the data (reported as load_s) and includes
      the evaluations. One precision (default fp32), the first model and batch.
  --sgemm    torch.mm on 8192 x 8192 matrices, once per --precision (fp32: fp32 with TF32 off,
             tf32: fp32 with TF32, bf16: bf16 operands): {"gemm_tflops", "precision", ...}, the
             gemm peak that this GPU achieves at that precision (the fp32 line also carries it as
             "sgemm_tflops"). With training flags, it runs first, in the same process.

Models: BasicNet (PyTorch's examples/mnist Net, NLL loss on log_softmax) and mlp7
(784-1024-1024-1024-512-512-256-10, ReLU between, NLL loss on log_softmax), the same
layers, in the same order, as tandem's presets and bench/peers/torch_models.py; resnet-small
(torch_models.ResNetSmall: BatchNorm, residual blocks, cross-entropy on logits) on --npy X,Y:
uint8 images [n, C, H, W] and class labels, normalised per channel (/255, then the channel's mean
and std over the set), as tandem normalises them. Throughput only: --time-to-acc reads
Fashion-MNIST.

usage: torch_gpu_bench.py [--model basicnet,mlp7,resnet-small] [--batch 64,512,4096]
                          [--precision fp32,tf32,bf16] [--mode eager,graph]
                          [--steps 300[,300,100]] [--warmup 30[,30,10]] [--data DIR] [--seed S]
                          [--npy X.npy,Y.npy (resnet-small's data)]
                          [--time-to-acc 90 [--epochs 3]] [--sgemm] [--cudnn-benchmark]
       with --time-to-acc, --precision takes one value (default fp32)
       --device cpu (hidden): a smoke test of the model and data paths without a GPU; graph
       mode and TF32 settings are skipped there (bf16 runs under CPU autocast)."""
import argparse
import contextlib
import gc
import gzip
import json
import os
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # the same normalisation as tandem's data layer


# tandem's presets' twins (both end in log_softmax, trained with NLL, as tandem's are)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import MLP7, BasicNet, ResNetSmall  # noqa: E402

# name -> (module, its loss): the presets ending in log_softmax train with NLL, resnet-small's
# logits with cross-entropy, as tandem trains them
MODELS = {"basicnet": (BasicNet, F.nll_loss), "mlp7": (MLP7, F.nll_loss),
          "resnet-small": (ResNetSmall, F.cross_entropy)}
IMAGE_MODELS = ("resnet-small",)  # trained on --npy's images, the others on Fashion-MNIST


def new_model(name, dev):
    return MODELS[name][0]().to(dev).train()


def loss_fn(model, out, y):
    return MODELS[model][1](out, y)
PRECISIONS = ("fp32", "tf32", "bf16")


def emit(obj):
    print(json.dumps(obj), flush=True)


def warn(msg):
    print(f"torch_gpu_bench: {msg}", file=sys.stderr, flush=True)


def load_split(data_dir, split, dev):
    """The IDX .gz files of one split, normalised, as (N,1,28,28) float32 and int64 on dev."""
    ipath = os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz")
    lpath = os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")
    for p in (ipath, lpath):
        if not os.path.exists(p):
            raise SystemExit(f"torch_gpu_bench: {p} not found (set --data or TANDEM_DATA to the "
                             "Fashion-MNIST directory)")
    with gzip.open(ipath) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(lpath) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (x.astype(np.float32) / 255.0 - MEAN) / STD
    return (torch.from_numpy(x).to(dev).contiguous(),
            torch.from_numpy(y.astype(np.int64)).to(dev))


def load_npy(pair, dev):
    """uint8 images [n, C, H, W] and labels from an X.npy,Y.npy pair, /255 and then each
    channel's mean and std over the set (tandem's normalisation), as float32 and int64 on dev."""
    xp, yp = pair.split(",")
    x = np.load(xp).astype(np.float32) / 255.0
    x = (x - x.mean(axis=(0, 2, 3), keepdims=True)) / x.std(axis=(0, 2, 3), keepdims=True)
    return (torch.from_numpy(x).to(dev).contiguous(),
            torch.from_numpy(np.load(yp).astype(np.int64)).to(dev))


def make_optimizer(params, dev, capturable):
    """AdamW lr 1e-3: fused where this PyTorch and device have it, else foreach."""
    params = list(params)
    kw = {"lr": 1e-3}
    if capturable:
        kw["capturable"] = True
    if dev.type == "cuda":
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "fused"
        except (TypeError, RuntimeError, ValueError) as e:
            warn(f"fused AdamW unavailable ({e}); using foreach")
    try:
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach"
    except (TypeError, RuntimeError, ValueError):
        return torch.optim.AdamW(params, **kw), "default"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def new_tf32_api():
    """True where this PyTorch has the per-backend fp32_precision settings (2.7 on). There the
    legacy allow_tf32 flags and set_float32_matmul_precision are left alone: from 2.9 they warn,
    and reading a legacy flag after a new-style write raises ("mix of the legacy and new APIs")."""
    return hasattr(torch.backends, "fp32_precision")


def set_tf32(dev, on):
    """TF32 on or off for cuBLAS matmuls and cuDNN convolutions (nothing to do on the CPU)."""
    if dev.type != "cuda":
        return
    if new_tf32_api():
        mode = "tf32" if on else "ieee"
        cudnn = torch.backends.cudnn
        targets = [torch.backends.cuda.matmul, cudnn.conv]
        # cuDNN's RNN setting, where it is one (in some versions cudnn.rnn is only a module):
        # unused here, kept equal to conv's, as a cuDNN state with the two different is refused
        # by whatever asks for cuDNN's TF32 setting without naming an operator
        rnn = getattr(cudnn, "rnn", None)
        if rnn is not None and not isinstance(rnn, types.ModuleType):
            targets.append(rnn)
        for t in targets:
            t.fp32_precision = mode
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
        torch.set_float32_matmul_precision("high" if on else "highest")


def use_precision(dev, precision):
    """Sets the global TF32 state for a measurement at this precision: on only for tf32."""
    set_tf32(dev, precision == "tf32")


def autocast(dev, precision):
    """The context around forward + loss: bf16 autocast for bf16 (the cast cache off, as CUDA
    graph capture requires; used for eager too, so both modes compute the same), else none."""
    if precision == "bf16":
        return torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class Batches:
    """Index tensors of B samples, from a fresh GPU permutation each epoch (tail dropped)."""

    def __init__(self, n, batch, dev, gen):
        if batch > n:
            raise ValueError(f"batch {batch} is larger than the {n} training samples")
        self.n, self.batch, self.dev, self.gen = n, batch, dev, gen
        self.per_epoch = n // batch
        self.pos = self.per_epoch
        self.perm = None

    def next(self):
        if self.pos == self.per_epoch:
            self.perm = torch.randperm(self.n, device=self.dev, generator=self.gen)
            self.pos = 0
        s = self.pos * self.batch
        self.pos += 1
        return self.perm[s:s + self.batch]


def device_generator(dev, seed):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return g


def eager_step(model, net, opt, X, Y, idx, dev, precision):
    xb = X.index_select(0, idx)
    yb = Y.index_select(0, idx)
    opt.zero_grad(set_to_none=True)
    with autocast(dev, precision):
        loss = loss_fn(model, net(xb), yb)
    loss.backward()
    opt.step()
    return loss


def throughput_eager(a, model, batch, precision, steps, warmup, X, Y, dev):
    torch.manual_seed(a.seed)
    net = new_model(model, dev)
    opt, opt_kind = make_optimizer(net.parameters(), dev, capturable=False)
    batches = Batches(X.shape[0], batch, dev, device_generator(dev, a.seed))
    for _ in range(warmup):
        loss = eager_step(model, net, opt, X, Y, batches.next(), dev, precision)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = eager_step(model, net, opt, X, Y, batches.next(), dev, precision)
    sync(dev)
    dt = time.perf_counter() - t0
    return dt, float(loss.item()), opt_kind


def throughput_graph(a, model, batch, precision, steps, warmup, X, Y, dev):
    torch.manual_seed(a.seed)
    net = new_model(model, dev)
    opt, opt_kind = make_optimizer(net.parameters(), dev, capturable=True)
    batches = Batches(X.shape[0], batch, dev, device_generator(dev, a.seed))
    static_idx = torch.zeros(batch, dtype=torch.long, device=dev)

    def step():
        xb = X.index_select(0, static_idx)
        yb = Y.index_select(0, static_idx)
        with autocast(dev, precision):
            loss = loss_fn(model, net(xb), yb)
        loss.backward()
        opt.step()
        return loss

    # Warm-up on a side stream (optimizer state, cuBLAS/cuDNN handles and workspaces), as in
    # PyTorch's whole-network capture example; these steps train too.
    static_idx.copy_(batches.next())
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(dev).wait_stream(s)

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the grads are allocated from the graph's private pool
    with torch.cuda.graph(g):
        static_loss = step()

    for _ in range(warmup):
        static_idx.copy_(batches.next())
        g.replay()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        static_idx.copy_(batches.next())
        g.replay()
    sync(dev)
    dt = time.perf_counter() - t0
    loss = float(static_loss.item())
    del g
    return dt, loss, opt_kind


def evaluate(net, X, Y, dev, precision, eval_batch=2000):
    net.eval()
    correct = torch.zeros((), dtype=torch.long, device=X.device)
    with torch.no_grad(), autocast(dev, precision):
        for s in range(0, X.shape[0], eval_batch):
            out = net(X[s:s + eval_batch])
            correct += (out.argmax(1) == Y[s:s + eval_batch]).sum()
    net.train()
    return 100.0 * correct.item() / X.shape[0]


def time_to_acc(a, model, batch, precision, dev, common):
    use_precision(dev, precision)
    t_load = time.perf_counter()
    X, Y = load_split(a.data, "train", dev)
    Xt, Yt = load_split(a.data, "t10k", dev)
    torch.manual_seed(a.seed)
    net = new_model(model, dev)
    opt, opt_kind = make_optimizer(net.parameters(), dev, capturable=False)
    gen = device_generator(dev, a.seed)
    n = X.shape[0]
    sync(dev)
    t0 = time.perf_counter()
    load_s = t0 - t_load
    accs, walls, hit = [], [], None
    for _ in range(a.epochs):
        perm = torch.randperm(n, device=dev, generator=gen)
        for s in range(0, n, batch):  # the tail batch too: every sample once per epoch
            eager_step(model, net, opt, X, Y, perm[s:s + batch], dev, precision)
        acc = evaluate(net, Xt, Yt, dev, precision)  # .item() synchronises
        wall = time.perf_counter() - t0
        accs.append(round(acc, 2))
        walls.append(round(wall, 3))
        if acc >= a.time_to_acc:
            hit = wall
            break
    emit(dict(common, model=model, batch=batch, precision=precision, mode="eager",
              tf32=precision == "tf32", target_acc=a.time_to_acc,
              time_to_acc_s=None if hit is None else round(hit, 3), acc=accs,
              epoch_wall_s=walls, load_s=round(load_s, 3), optimizer=opt_kind,
              steps_per_epoch=(n + batch - 1) // batch))
    return hit is not None


def sgemm(dev, n, iters, precision, common):
    """torch.mm of two n x n matrices at this precision: fp32 (TF32 off), tf32, or bf16 operands
    (fp32 accumulation, bf16 result)."""
    use_precision(dev, precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = device_generator(dev, 0)
    A = torch.randn(n, n, device=dev, generator=g).to(dtype)
    B = torch.randn(n, n, device=dev, generator=g).to(dtype)
    C = torch.empty(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        torch.mm(A, B, out=C)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.mm(A, B, out=C)
    sync(dev)
    dt = time.perf_counter() - t0
    tflops = round(2.0 * n * n * n * iters / dt / 1e12, 2)
    rec = dict(common, gemm_tflops=tflops, precision=precision, n=n, iters=iters,
               dtype=str(dtype).replace("torch.", ""), tf32=precision == "tf32")
    if precision == "fp32":
        rec["sgemm_tflops"] = tflops
    emit(rec)


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def csv(kind, conv):
    def parse(s):
        try:
            vals = [conv(v) for v in s.split(",") if v]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"bad {kind} list {s!r}: {e}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"empty {kind} list")
        return vals
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=csv("model", str), default=None,
                    help="basicnet, mlp7, resnet-small or a comma list (default basicnet)")
    ap.add_argument("--batch", type=csv("batch", int), default=None,
                    help="batch size or a comma list (default 64)")
    ap.add_argument("--mode", type=csv("mode", str), default=None,
                    help="eager, graph or a comma list (default eager)")
    ap.add_argument("--precision", type=csv("precision", str), default=None,
                    help="fp32, tf32, bf16 or a comma list (default fp32)")
    ap.add_argument("--steps", type=csv("steps", int), default=[300],
                    help="timed steps: one value, or one per --batch (default 300)")
    ap.add_argument("--warmup", type=csv("warmup", int), default=[30],
                    help="untimed steps first: one value, or one per --batch (default 30)")
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--npy", default=None, metavar="X.npy,Y.npy",
                    help="resnet-small's data: uint8 images [n, C, H, W] and class labels")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-to-acc", type=float, default=None, metavar="PCT",
                    help="train eager epochs until test accuracy >= PCT")
    ap.add_argument("--epochs", type=int, default=3, help="the most epochs for --time-to-acc")
    ap.add_argument("--sgemm", action="store_true",
                    help="measure gemm TFLOP/s at each --precision")
    ap.add_argument("--sgemm-n", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True (default: PyTorch's default, off)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args()
    # --sgemm alone measures only that; any training flag asks for training too
    train_asked = (a.time_to_acc is not None or not a.sgemm
                   or any(v is not None for v in (a.model, a.batch, a.mode)))
    a.model = a.model or ["basicnet"]
    a.batch = a.batch or [64]
    a.mode = a.mode or ["eager"]
    a.precision = a.precision or ["fp32"]
    for m in a.model:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}: use {', '.join(MODELS)}")
    for m in a.mode:
        if m not in ("eager", "graph"):
            ap.error(f"unknown mode {m!r}: use eager or graph")
    for p in a.precision:
        if p not in PRECISIONS:
            ap.error(f"unknown precision {p!r}: use {', '.join(PRECISIONS)}")
    if a.time_to_acc is not None and len(a.precision) > 1:
        ap.error("--time-to-acc takes one --precision")
    if any(m in IMAGE_MODELS for m in a.model):
        if not a.npy:
            ap.error("resnet-small trains on --npy X.npy,Y.npy (CIFAR-shaped uint8 images)")
        if a.time_to_acc is not None:
            ap.error("--time-to-acc reads Fashion-MNIST: use basicnet or mlp7")
    elif a.npy:
        ap.error("--npy is resnet-small's data; basicnet and mlp7 read Fashion-MNIST (--data)")
    for name in ("steps", "warmup"):
        vals = getattr(a, name)
        if len(vals) == 1:
            setattr(a, name, vals * len(a.batch))
        elif len(vals) != len(a.batch):
            ap.error(f"--{name} has {len(vals)} values for {len(a.batch)} batch sizes: give one, "
                     "or one per batch")
    if (min(a.steps) < 1 or min(a.warmup) < 0 or a.epochs < 1 or min(a.batch) < 1):
        ap.error("--steps, --epochs and --batch must be positive, --warmup not negative")

    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_gpu_bench: CUDA is not available to this PyTorch "
                             f"({torch.__version__})")
        # PyTorch 2.x wants an index here ("cuda" alone is refused)
        dev = torch.device("cuda", dev.index if dev.index is not None else 0)
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    use_precision(dev, "fp32")  # each measurement sets its own; fp32 (TF32 off) until then
    common = {"peer": "torch", "torch": torch.__version__, "cuda": torch.version.cuda,
              "device": device_name(dev)}

    failures = 0
    if a.sgemm:
        n = a.sgemm_n or (8192 if dev.type == "cuda" else 1024)
        for precision in a.precision:
            try:
                # about 0.2-0.4 s each on an H100: the tensor-core precisions get more iterations
                iters = ({"fp32": 20, "tf32": 60, "bf16": 120}[precision]
                         if dev.type == "cuda" else 3)
                sgemm(dev, n, iters, precision, common)
            except Exception as e:  # noqa: BLE001 - report and go on with the other measurements
                failures += 1
                warn(f"gemm {precision} failed: {type(e).__name__}: {e}")
                emit(dict(common, gemm_tflops=None, precision=precision,
                          error=f"{type(e).__name__}: {e}"))
            free_memory(dev)

    if a.time_to_acc is not None:
        if not time_to_acc(a, a.model[0], a.batch[0], a.precision[0], dev, common):
            warn(f"test accuracy {a.time_to_acc}% not reached in {a.epochs} epochs")
        return 1 if failures else 0
    if not train_asked:
        return 1 if failures else 0

    data = {}
    for model in a.model:
        images = model in IMAGE_MODELS
        if images not in data:
            data[images] = load_npy(a.npy, dev) if images else load_split(a.data, "train", dev)
        X, Y = data[images]
        for batch, steps, warmup in zip(a.batch, a.steps, a.warmup):
            for precision in a.precision:
                for mode in a.mode:
                    rec = dict(common, model=model, batch=batch, precision=precision, mode=mode,
                               tf32=precision == "tf32", steps=steps, warmup=warmup)
                    what = f"{model} batch {batch} {precision} {mode}"
                    if mode == "graph" and dev.type != "cuda":
                        warn(f"{what}: graph mode needs CUDA; skipped on {dev.type}")
                        emit(dict(rec, skipped="graph mode needs CUDA"))
                        continue
                    try:
                        use_precision(dev, precision)
                        fn = throughput_graph if mode == "graph" else throughput_eager
                        dt, loss, opt_kind = fn(a, model, batch, precision, steps, warmup, X, Y,
                                                dev)
                        emit(dict(rec, samples_per_s=round(steps * batch / dt, 1),
                                  step_us=round(1e6 * dt / steps, 1), final_loss=round(loss, 4),
                                  optimizer=opt_kind))
                    except Exception as e:  # noqa: BLE001 - one failed measurement, the rest go on
                        failures += 1
                        warn(f"{what} failed: {type(e).__name__}: {e}")
                        emit(dict(rec, error=f"{type(e).__name__}: {e}"))
                    free_memory(dev)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
