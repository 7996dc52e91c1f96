"""The ResNet stem's max pool, ATen's against the parity-plane backward (parity_max_pool.py), on one GPU.

    python bench/stem_pool.py [--batch 256] [--mode reduce-overhead] [--steps 50] [--rounds 2] [--skip-model]

Two parts, each side by side in this one process:

1. The pool alone: ReLU then the 3x3 stride-2 pool of a (batch, 64, 112, 112) bf16 channels_last tensor, forward and
   backward with the output's gradient the sum of two tensors (as in ResNet, where the pooled activation feeds the
   first block's convolution and its shortcut): eager ATen, compiled ATen, compiled parity. ms per iteration by CUDA
   events, and whether the compiled parity's output and input gradient equal eager ATen's.
2. ResNet-50 training steps (bf16 autocast, channels_last, SGD with momentum, fused; synthetic batch on the GPU),
   compiled with ``--mode``: the stock model against the same weights with the parity pool, timed in alternating
   rounds of ``--steps`` steps after a warm-up, then images/s and the ratio.

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from parity_max_pool import parity_max_pool, replace_stem_pool  # noqa: E402


def cuda_ms(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def pool_alone(batch: int, iters: int) -> None:
    torch.manual_seed(0)
    shape = (batch, 64, 112, 112)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    g1 = torch.randn((batch, 64, 56, 56), device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    g2 = torch.randn_like(g1)

    def forward(pool):
        # Two outputs, so the backward graph adds their gradients before the pool's backward, as ResNet's does.
        def run(x):
            y = pool(x.relu())
            return y, 2 * y

        return run

    def step(fn):
        def run():
            y, y2 = fn(xg)
            xg.grad = None
            torch.autograd.backward((y, y2), (g1, g2))
            return y, xg.grad

        return run

    aten = forward(lambda t: F.max_pool2d(t, 3, 2, 1))
    parity = forward(parity_max_pool)
    rows = [("eager ATen", step(aten)), ("compiled ATen", step(torch.compile(aten, dynamic=False))),
            ("compiled parity", step(torch.compile(parity, dynamic=False)))]  # fmt: skip
    xg = x.detach().requires_grad_()
    ref_y = rows[0][1]()[0]
    print(f"\n## The pool alone: ReLU + max_pool2d(3, 2, 1), {tuple(shape)} bf16 channels_last, forward + backward\n")
    print("| variant | ms | output equal | input grad: max abs diff to eager ATen | to compiled ATen |")
    print("|---|---|---|---|---|")
    grads = {}
    for name, fn in rows:
        y, gx = fn()  # compiles
        grads[name] = gx.clone()
        torch.cuda.synchronize()
        ms = cuda_ms(fn, iters)
        # Compiled, the two output gradients are added in fp32 inside the backward kernel; eager rounds their sum
        # to bf16 first: so compiled ATen is the reference a compiled parity pool should match bit for bit.
        diffs = [(gx.float() - grads[ref].float()).abs().max().item() for ref in ("eager ATen", "compiled ATen")
                 if ref in grads]  # fmt: skip
        cells = [f"{d:.3g}" for d in diffs] + [""] * (2 - len(diffs))
        print(f"| {name} | {ms:.3f} | {torch.equal(y, ref_y)} | {' | '.join(cells)} |")


def model_steps(batch: int, mode: str, steps: int, warmup: int, rounds: int) -> None:
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    stock = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    parity = replace_stem_pool(copy.deepcopy(stock))
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    runs = {}
    for name, model in (("stock", stock), ("parity", parity)):
        net = torch.compile(model, mode=mode, dynamic=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)

        def step(net=net, opt=opt):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t = time.perf_counter()
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        print(f"{name}: compile + {warmup} warm-up steps {time.perf_counter() - t:.0f} s", flush=True)
        runs[name] = step
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, step in runs.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    rate = {name: batch * steps / min(ts) for name, ts in times.items()}
    print(f"\n## ResNet-50 training, bf16 channels_last, batch {batch}, torch.compile mode {mode}\n")
    print(f"best of {rounds} alternating rounds of {steps} steps, after {warmup} warm-up steps each\n")
    print("| model | img/s | ms a step | every round, img/s | vs stock |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        each = ", ".join(f"{batch * steps / t:,.0f}" for t in ts)
        ms = 1000 * min(ts) / steps
        print(f"| {name} | {rate[name]:,.1f} | {ms:.2f} | {each} | {rate[name] / rate['stock']:.4f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--iters", type=int, default=50, help="iterations of the pool alone")
    p.add_argument("--mode", default="reduce-overhead", help="torch.compile mode of the model part")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip-model", action="store_true", help="only the pool alone")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/stem_pool.py: needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    pool_alone(a.batch, a.iters)
    if not a.skip_model:
        model_steps(a.batch, a.mode, a.steps, a.warmup, a.rounds)


if __name__ == "__main__":
    main()
