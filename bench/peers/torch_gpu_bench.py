"""PyTorch peer on CUDA for bench_gpu.sh: BasicNet or mlp7 on Fashion-MNIST with the data resident
on the GPU, AdamW lr 1e-3, fp32 with TF32 off. Prints one JSON line per measurement.

  throughput (default): --model M[,M..] --batch B[,B..] --mode eager|graph[,..] --steps N --warmup W
      every combination, in that order; W untimed steps, then N steps timed between two
      torch.cuda.synchronize() calls:
      {"peer": "torch", "model", "batch", "mode", "samples_per_s", "step_us", ...}
      eager: gather (index_select by a slice of a GPU random permutation), forward, loss,
             backward, optimizer.step, one kernel launch at a time.
      graph: that whole step captured in one CUDA graph (torch.cuda.graph after warm-up on a side
             stream, PyTorch's "whole network capture"); the batch's index tensor is a static
             tensor refilled from the permutation before each replay; AdamW capturable=True.
  --time-to-acc T [--epochs E]   eager training, epochs of 60000 samples (the tail batch kept),
      test accuracy on the GPU after each epoch, stop at the first >= T percent (at most E epochs,
      default 3): {"peer": "torch", "time_to_acc_s", "acc": [per-epoch %], "epoch_wall_s", ...};
      the time excludes loading the data (reported as load_s) and includes the evaluations.
  --sgemm    fp32 torch.mm on 8192 x 8192 matrices, TF32 off: {"sgemm_tflops": ...}, the fp32
             peak that this GPU achieves.

Models: BasicNet (PyTorch's examples/mnist Net, NLL loss on log_softmax) and mlp7
(784-1024-1024-1024-512-512-256-10, ReLU between, cross-entropy on the logits), the same
layers, in the same order, as tandem's presets and bench/peers/torch_models.py.

usage: torch_gpu_bench.py [--model basicnet,mlp7] [--batch 64,512] [--mode eager,graph]
                          [--steps 300] [--warmup 30] [--data DIR] [--seed S]
                          [--time-to-acc 90 [--epochs 3]] [--sgemm] [--cudnn-benchmark]
       --device cpu (hidden): a smoke test of the model and data paths without a GPU; graph
       mode and TF32 settings are skipped there."""
import argparse
import gc
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # the same normalisation as tandem's data layer


# tandem's presets' twins (both end in log_softmax, trained with NLL, as tandem's are)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import MLP7, BasicNet  # noqa: E402


def loss_fn(out, y):
    return F.nll_loss(out, y)


MODELS = {"basicnet": BasicNet, "mlp7": MLP7}


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


def eager_step(net, opt, X, Y, idx):
    xb = X.index_select(0, idx)
    yb = Y.index_select(0, idx)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(net(xb), yb)
    loss.backward()
    opt.step()
    return loss


def throughput_eager(a, model, batch, X, Y, dev):
    torch.manual_seed(a.seed)
    net = MODELS[model]().to(dev).train()
    opt, opt_kind = make_optimizer(net.parameters(), dev, capturable=False)
    batches = Batches(X.shape[0], batch, dev, device_generator(dev, a.seed))
    for _ in range(a.warmup):
        loss = eager_step(net, opt, X, Y, batches.next())
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = eager_step(net, opt, X, Y, batches.next())
    sync(dev)
    dt = time.perf_counter() - t0
    return dt, float(loss.item()), opt_kind


def throughput_graph(a, model, batch, X, Y, dev):
    torch.manual_seed(a.seed)
    net = MODELS[model]().to(dev).train()
    opt, opt_kind = make_optimizer(net.parameters(), dev, capturable=True)
    batches = Batches(X.shape[0], batch, dev, device_generator(dev, a.seed))
    static_idx = torch.zeros(batch, dtype=torch.long, device=dev)

    def step():
        xb = X.index_select(0, static_idx)
        yb = Y.index_select(0, static_idx)
        loss = loss_fn(net(xb), yb)
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

    for _ in range(a.warmup):
        static_idx.copy_(batches.next())
        g.replay()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        static_idx.copy_(batches.next())
        g.replay()
    sync(dev)
    dt = time.perf_counter() - t0
    loss = float(static_loss.item())
    del g
    return dt, loss, opt_kind


def evaluate(net, X, Y, eval_batch=2000):
    net.eval()
    correct = torch.zeros((), dtype=torch.long, device=X.device)
    with torch.no_grad():
        for s in range(0, X.shape[0], eval_batch):
            out = net(X[s:s + eval_batch])
            correct += (out.argmax(1) == Y[s:s + eval_batch]).sum()
    net.train()
    return 100.0 * correct.item() / X.shape[0]


def time_to_acc(a, model, batch, dev, common):
    t_load = time.perf_counter()
    X, Y = load_split(a.data, "train", dev)
    Xt, Yt = load_split(a.data, "t10k", dev)
    torch.manual_seed(a.seed)
    net = MODELS[model]().to(dev).train()
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
            eager_step(net, opt, X, Y, perm[s:s + batch])
        acc = evaluate(net, Xt, Yt)  # .item() synchronises
        wall = time.perf_counter() - t0
        accs.append(round(acc, 2))
        walls.append(round(wall, 3))
        if acc >= a.time_to_acc:
            hit = wall
            break
    emit(dict(common, model=model, batch=batch, mode="eager", target_acc=a.time_to_acc,
              time_to_acc_s=None if hit is None else round(hit, 3), acc=accs,
              epoch_wall_s=walls, load_s=round(load_s, 3), optimizer=opt_kind,
              steps_per_epoch=(n + batch - 1) // batch))
    return hit is not None


def sgemm(dev, n, iters):
    g = device_generator(dev, 0)
    A = torch.randn(n, n, device=dev, generator=g)
    B = torch.randn(n, n, device=dev, generator=g)
    C = torch.empty(n, n, device=dev)
    for _ in range(3):
        torch.mm(A, B, out=C)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.mm(A, B, out=C)
    sync(dev)
    dt = time.perf_counter() - t0
    tflops = 2.0 * n * n * n * iters / dt / 1e12
    emit({"sgemm_tflops": round(tflops, 2), "n": n, "iters": iters, "dtype": "float32",
          "tf32": False, "device": device_name(dev)})


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def csv(kind, conv):
    def parse(s):
        vals = [conv(v) for v in s.split(",") if v]
        if not vals:
            raise argparse.ArgumentTypeError(f"empty {kind} list")
        return vals
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=csv("model", str), default=None,
                    help="basicnet, mlp7 or a comma list (default basicnet)")
    ap.add_argument("--batch", type=csv("batch", int), default=None,
                    help="batch size or a comma list (default 64)")
    ap.add_argument("--mode", type=csv("mode", str), default=None,
                    help="eager, graph or a comma list (default eager)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-to-acc", type=float, default=None, metavar="PCT",
                    help="train eager epochs until test accuracy >= PCT")
    ap.add_argument("--epochs", type=int, default=3, help="the most epochs for --time-to-acc")
    ap.add_argument("--sgemm", action="store_true", help="measure fp32 sgemm TFLOP/s")
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
    for m in a.model:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}: use {', '.join(MODELS)}")
    for m in a.mode:
        if m not in ("eager", "graph"):
            ap.error(f"unknown mode {m!r}: use eager or graph")
    if a.steps < 1 or a.warmup < 0 or a.epochs < 1 or min(a.batch) < 1:
        ap.error("--steps, --epochs and --batch must be positive, --warmup not negative")

    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_gpu_bench: CUDA is not available to this PyTorch "
                             f"({torch.__version__})")
        # PyTorch 2.x wants an index here ("cuda" alone is refused)
        dev = torch.device("cuda", dev.index if dev.index is not None else 0)
        torch.cuda.set_device(dev)
        # fp32 throughout: no TF32 in matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    torch.set_float32_matmul_precision("highest")
    common = {"peer": "torch", "torch": torch.__version__, "device": device_name(dev)}

    failures = 0
    if a.sgemm:
        n = a.sgemm_n or (8192 if dev.type == "cuda" else 1024)
        try:
            sgemm(dev, n, iters=20 if dev.type == "cuda" else 3)
        except Exception as e:  # noqa: BLE001 - report and go on with the other measurements
            failures += 1
            emit({"sgemm_tflops": None, "error": f"{type(e).__name__}: {e}"})
        free_memory(dev)

    if a.time_to_acc is not None:
        if not time_to_acc(a, a.model[0], a.batch[0], dev, common):
            warn(f"test accuracy {a.time_to_acc}% not reached in {a.epochs} epochs")
        return 1 if failures else 0
    if not train_asked:
        return 1 if failures else 0

    X, Y = load_split(a.data, "train", dev)
    for model in a.model:
        for batch in a.batch:
            for mode in a.mode:
                rec = dict(common, model=model, batch=batch, mode=mode, steps=a.steps,
                           warmup=a.warmup)
                if mode == "graph" and dev.type != "cuda":
                    warn(f"{model} batch {batch}: graph mode needs CUDA; skipped on {dev.type}")
                    emit(dict(rec, skipped="graph mode needs CUDA"))
                    continue
                try:
                    fn = throughput_graph if mode == "graph" else throughput_eager
                    dt, loss, opt_kind = fn(a, model, batch, X, Y, dev)
                    emit(dict(rec, samples_per_s=round(a.steps * batch / dt, 1),
                              step_us=round(1e6 * dt / a.steps, 1), final_loss=round(loss, 4),
                              optimizer=opt_kind))
                except Exception as e:  # noqa: BLE001 - one failed measurement, the rest go on
                    failures += 1
                    warn(f"{model} batch {batch} {mode} failed: {type(e).__name__}: {e}")
                    emit(dict(rec, error=f"{type(e).__name__}: {e}"))
                free_memory(dev)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
