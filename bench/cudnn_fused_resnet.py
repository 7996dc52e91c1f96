"""Probe: ResNet-50 trained with cuDNN's fused conv + BN-statistics forward graphs, against torchvision's, one run.

bench/cudnn_fusion_probe.py measured one layer at a time: cuDNN's forward graph (the previous BN's scale/bias/ReLU as
the conv's prologue, the conv, this BN's sums as its epilogue) took about half the time of the compiled torch layer,
while cuDNN's backward graphs were slower than torch's. This probe builds the whole network that way, forward in
cuDNN, backward in torch (compiled with the rest), and times its training step against torchvision's ResNet-50 side
by side, eager and compiled.

Each bottleneck's three convolutions go through one custom op, ``conv_stats(x, scale, bias, w)``: y = conv(relu(x *
scale + bias), w) (no prologue for the block's first conv, whose input is the block's input) and the per-channel sum
and sum of squares of y. The BN that follows is folded from those sums into the next op's scale and bias; the
block's last BN, the downsample's BN (its conv goes through the op too), the residual add and the ReLU are torch
pointwise work; the stem and the classifier are torchvision's. The op's backward (torch ops: the recomputed ReLU
input, ``convolution_backward``, the sums' gradients) is what ``torch.compile`` traces and fuses.
Where a graph does not build (a stride cuDNN's fusion does not take, a dtype without an engine), the op computes the
same in torch and the probe says how many convolutions that was.

Correctness comes first. Four blocks (one of each layer, one with a downsample), each alone, in fp16 against the
same block in fp32: the output and the input's and parameters' gradients of the fused block and of torchvision's in
the same autocast; the probe stops if a fused error is more than three times torchvision's plus 0.01, or if the
network's loss is off. (The whole untrained network's gradients are printed, not checked: fp16's rounding grows
through it to most of the early layers' gradients, for torchvision's model as much.)

Needs the cuDNN frontend's Python bindings (not a dependency of the application): see cudnn_fusion_probe.py's
docstring for carrying the wheel, then ``python bench/cudnn_fused_resnet.py --fe-path /tmp/fe``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from cudnn_fusion_probe import affine, finish, import_frontend  # bench/, the script's own folder
from torch import Tensor, nn

CL = torch.channels_last
_FE: dict = {"cudnn": None, "handle": None}  # the frontend module and a handle, once imported (main)
_GRAPHS: dict[tuple, object] = {}  # per shape: (graph, its tensors, workspace bytes), or None where none builds


def _build_graph(x: Tensor, w: Tensor, scale: Tensor, y: Tensor, sums: Tensor, stride: int, padding: int,
                 prologue: bool) -> tuple:  # fmt: skip
    cudnn = _FE["cudnn"]
    f32 = cudnn.data_type.FLOAT
    io = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}[x.dtype]
    # Intermediate = io type, as the frontend's own genstats test: the ReLU output is the MMA's operand.
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=io, compute_data_type=f32, handle=_FE["handle"])

    def tensor(name: str, v: Tensor) -> object:
        return g.tensor(name=name, dim=list(v.shape), stride=list(v.stride()), data_type=io)

    named = {"x": tensor("X", x), "w": tensor("W", w)}
    conv_in = named["x"]
    if prologue:
        named["s"], named["b"] = tensor("S", scale), tensor("B", scale)
        conv_in = g.relu(name="relu", input=affine(g, conv_in, named["s"], named["b"]))
    out = g.conv_fprop(image=conv_in, weight=named["w"], padding=[padding] * 2, stride=[stride] * 2,
                       dilation=[1, 1], name="conv")  # fmt: skip
    named["y"] = out.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride())).set_data_type(io)
    for key, t in zip(("sum", "sq"), g.genstats(name="genstats", input=out), strict=True):
        named[key] = t.set_output(True).set_dim(list(sums.shape)).set_stride(list(sums.stride())).set_data_type(f32)
    finish(cudnn, g, autotune=False)
    return g, named, g.get_workspace_size()


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The sums' type: fp32 for the half types (as cuDNN's genstats), else the input's (fp64 in the CPU tests)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _out_shape(x: Tensor, w: Tensor, stride: int, padding: int) -> tuple[int, int, int, int]:
    size = [(d + 2 * padding - k) // stride + 1 for d, k in zip(x.shape[2:], w.shape[2:], strict=True)]
    return x.shape[0], w.shape[0], size[0], size[1]


@torch.library.custom_op("fused_resnet_probe::conv_stats", mutates_args=())
def conv_stats(x: Tensor, scale: Tensor, bias: Tensor, w: Tensor, stride: int, padding: int, prologue: bool
               ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """y = conv(relu(x * scale + bias) if prologue else x, w), and y's per-channel sum and sum of squares (fp32)."""
    x, w = x.contiguous(memory_format=CL), w.contiguous(memory_format=CL)
    scale, bias = scale.contiguous(memory_format=CL), bias.contiguous(memory_format=CL)
    y = torch.empty(_out_shape(x, w, stride, padding), dtype=x.dtype, device=x.device, memory_format=CL)
    total, squares = (torch.empty((1, w.shape[0], 1, 1), dtype=_accumulation(x.dtype), device=x.device,
                                  memory_format=CL) for _ in range(2))  # fmt: skip
    key = (x.shape, x.stride(), w.shape, w.stride(), stride, padding, prologue, x.dtype)
    if key not in _GRAPHS:
        _GRAPHS[key] = None
        if _FE["cudnn"] is not None and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            try:
                _GRAPHS[key] = _build_graph(x, w, scale, y, total, stride, padding, prologue)
            except Exception as error:  # noqa: BLE001 - the frontend raises several types; all mean "no graph"
                print(f"  no cuDNN graph for x {tuple(x.shape)} w {tuple(w.shape)} stride {stride}: "
                      f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")  # fmt: skip
    entry = _GRAPHS[key]
    if entry is None:  # the same computation in torch
        a = torch.relu(x * scale + bias) if prologue else x
        y.copy_(F.conv2d(a, w, stride=stride, padding=padding))
        wide = y.to(total.dtype)
        total.copy_(wide.sum((0, 2, 3), keepdim=True))
        squares.copy_((wide * wide).sum((0, 2, 3), keepdim=True))
        return y, total, squares
    graph, named, workspace_bytes = entry
    pack = {named["x"]: x, named["w"]: w, named["y"]: y, named["sum"]: total, named["sq"]: squares}
    if prologue:
        pack[named["s"]], pack[named["b"]] = scale, bias
    workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=x.device)
    _FE["cudnn"].set_stream(_FE["handle"], torch.cuda.current_stream().cuda_stream)
    graph.execute(pack, workspace, handle=_FE["handle"])
    return y, total, squares


@conv_stats.register_fake
def _(x: Tensor, scale: Tensor, bias: Tensor, w: Tensor, stride: int, padding: int, prologue: bool
      ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    y = torch.empty(_out_shape(x, w, stride, padding), dtype=x.dtype, device=x.device, memory_format=CL)
    sums = [torch.empty((1, w.shape[0], 1, 1), dtype=_accumulation(x.dtype), device=x.device, memory_format=CL)
            for _ in range(2)]  # fmt: skip
    return y, sums[0], sums[1]


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
    x, scale, bias, w, stride, padding, prologue = inputs
    ctx.save_for_backward(x, scale, bias, w, output[0])
    ctx.stride, ctx.padding, ctx.prologue = stride, padding, prologue


def _backward(ctx, grad_y, grad_sum, grad_squares):  # noqa: ANN001, ANN202
    x, scale, bias, w, y = ctx.saved_tensors
    # The sums' gradients reach y: d(sum)/dy = 1, d(sum of squares)/dy = 2y.
    wide = _accumulation(y.dtype)
    grad = grad_y.to(wide) if grad_y is not None else torch.zeros_like(y, dtype=wide)
    if grad_sum is not None:
        grad = grad + grad_sum
    if grad_squares is not None:
        grad = grad + 2 * y.to(wide) * grad_squares
    grad = grad.to(y.dtype)
    if ctx.prologue:
        z = x * scale + bias  # recomputed: the forward never wrote it
        a = torch.relu(z)
    else:
        a = x
    grad_a, grad_w, _ = torch.ops.aten.convolution_backward(
        grad, a, w, None, [ctx.stride] * 2, [ctx.padding] * 2, [1, 1], False, [0, 0], 1, [True, True, False]
    )
    if not ctx.prologue:
        return grad_a, None, None, grad_w, None, None, None
    grad_z = torch.where(z > 0, grad_a, torch.zeros_like(grad_a))
    grad_z_wide = grad_z.to(wide)
    grad_scale = (grad_z_wide * x.to(wide)).sum((0, 2, 3), keepdim=True).to(scale.dtype)
    grad_bias = grad_z_wide.sum((0, 2, 3), keepdim=True).to(bias.dtype)
    return grad_z * scale, grad_scale, grad_bias, grad_w, None, None, None


torch.library.register_autograd("fused_resnet_probe::conv_stats", _backward, setup_context=_setup_context)


def fold(bn: nn.BatchNorm2d, total: Tensor, squares: Tensor, count: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The training BN over y as a scale and bias from y's sums (and its running statistics updated, as BN's)."""
    mean = total.view(-1) / count
    var = (squares.view(-1) / count - mean * mean).clamp_min(0)
    if bn.training:
        with torch.no_grad():
            bn.running_mean.lerp_(mean.detach(), bn.momentum)
            bn.running_var.lerp_(var.detach() * (count / (count - 1)), bn.momentum)
    scale = bn.weight * torch.rsqrt(var + bn.eps)
    bias = bn.bias - mean * scale
    return tuple(t.view(1, -1, 1, 1).to(dtype).contiguous(memory_format=CL) for t in (scale, bias))


class FusedBottleneck(nn.Module):
    """torchvision's Bottleneck (its modules and weights), its convs (the downsample's too) and BN statistics through
    :func:`conv_stats`."""

    def __init__(self, block: torchvision.models.resnet.Bottleneck, dtype: torch.dtype) -> None:
        super().__init__()
        self.conv1, self.bn1, self.conv2, self.bn2 = block.conv1, block.bn1, block.conv2, block.bn2
        self.conv3, self.bn3, self.downsample = block.conv3, block.bn3, block.downsample
        self.stride, self.dtype = block.conv2.stride[0], dtype
        self.register_buffer("unit", torch.ones(1, block.conv1.in_channels, 1, 1, dtype=dtype), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.dtype)
        y, total, squares = conv_stats(x, self.unit, self.unit, self.conv1.weight.to(self.dtype), 1, 0, False)
        scale, bias = fold(self.bn1, total, squares, y.numel() // y.shape[1], self.dtype)
        y, total, squares = conv_stats(y, scale, bias, self.conv2.weight.to(self.dtype), self.stride, 1, True)
        scale, bias = fold(self.bn2, total, squares, y.numel() // y.shape[1], self.dtype)
        y, total, squares = conv_stats(y, scale, bias, self.conv3.weight.to(self.dtype), 1, 0, True)
        scale, bias = fold(self.bn3, total, squares, y.numel() // y.shape[1], self.dtype)
        if self.downsample is None:
            return torch.relu(y * scale + bias + x).to(self.dtype)
        # torchvision's downsample: a strided 1x1 conv and its BN, whose apply joins the block's last pointwise work.
        conv, bn = self.downsample
        shortcut, total, squares = conv_stats(x, self.unit, self.unit, conv.weight.to(self.dtype), conv.stride[0], 0,
                                              False)  # fmt: skip
        shortcut_scale, shortcut_bias = fold(bn, total, squares, shortcut.numel() // shortcut.shape[1], self.dtype)
        return torch.relu(y * scale + bias + shortcut * shortcut_scale + shortcut_bias).to(self.dtype)


def fuse(model: torchvision.models.ResNet, dtype: torch.dtype) -> torchvision.models.ResNet:
    """A copy of ``model`` whose bottlenecks are :class:`FusedBottleneck` (same weights and buffers)."""
    fused = copy.deepcopy(model)
    for name in ("layer1", "layer2", "layer3", "layer4"):
        layer = getattr(fused, name)
        for i, block in enumerate(layer):
            layer[i] = FusedBottleneck(block, dtype)
    return fused.to(next(model.parameters()).device)


def train_step(model: nn.Module, x: Tensor, target: Tensor, autocast: torch.dtype | None) -> Tensor:
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = F.cross_entropy(model(x), target)
    loss.backward()
    return loss.detach()


def relative_errors(model: nn.Module, reference: nn.Module, names: list[str]) -> dict[str, float]:
    params, ref = dict(model.named_parameters()), dict(reference.named_parameters())
    return {n: float((params[n].grad.float() - ref[n].grad).norm() / ref[n].grad.norm()) for n in names}


#: Blocks checked one by one (name, the height and width of its input): one of each layer, with and without stride.
CHECKED_BLOCKS = (("layer1.0", 56), ("layer2.0", 56), ("layer3.3", 14), ("layer4.2", 7))
#: Each block's checked outputs: its output, its input's gradient, and the gradients of these parameters.
CHECKED_PARAMETERS = ("conv1.weight", "conv2.weight", "conv3.weight", "bn1.weight", "bn2.bias", "bn3.weight")


def block_errors(block: nn.Module, fused: bool, x: Tensor, grad_out: Tensor) -> dict[str, float]:
    """Relative errors (|v - v32| / |v32|) of a block's output and gradients in fp16 against the block in fp32."""
    results = []
    for dtype in (torch.float32, torch.float16):
        model = copy.deepcopy(block)
        if dtype == torch.float16 and fused:
            model = FusedBottleneck(model, torch.float16).to(x.device)
        inp = x.detach().to(dtype, copy=True).requires_grad_()
        torch.backends.cudnn.allow_tf32 = dtype == torch.float16  # the reference without TF32's 10-bit mantissa
        with torch.autocast(x.device.type, dtype=torch.float16, enabled=dtype == torch.float16):
            out = model(inp)
        (out.float() * grad_out).sum().backward()
        params = dict(model.named_parameters())
        results.append({"output": out.detach().float(), "input grad": inp.grad.float(),
                        **{n: params[n].grad.float() for n in CHECKED_PARAMETERS}})  # fmt: skip
    torch.backends.cudnn.allow_tf32 = True
    reference, half = results
    return {k: float((half[k] - reference[k]).norm() / reference[k].norm()) for k in reference}


def check_blocks(base: nn.Module, batch: int) -> bool:
    """Each checked block, fused and torchvision's, in fp16 against fp32: the fused error within 3x torchvision's."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    ok = True
    print(f"{'block: |v - v32| / |v32|':26} {'torchvision fp16':>17} {'fused fp16':>11}")
    for name, side in CHECKED_BLOCKS:
        block = base.get_submodule(name)
        shape = (batch, block.conv1.in_channels, side, side)
        x = torch.relu(torch.randn(shape, device="cuda", generator=generator)).contiguous(memory_format=CL)
        out_side = side // block.conv2.stride[0]
        grad_out = torch.randn((batch, block.conv3.out_channels, out_side, out_side), device="cuda",
                               generator=generator).contiguous(memory_format=CL)  # fmt: skip
        torchvision_errors = block_errors(block, False, x, grad_out)
        fused_errors = block_errors(block, True, x, grad_out)
        for key, error in fused_errors.items():
            bound = 3 * torchvision_errors[key] + 1e-2  # a wrong graph is off by O(1); fp16 rounding by ~1e-2
            ok &= error <= bound
            mark = "" if error <= bound else " !"
            print(f"{name + ' ' + key:26} {torchvision_errors[key]:17.2e} {error:11.2e}{mark}")
    return ok


def time_steps(model: nn.Module, mode: str, x: Tensor, target: Tensor, args: argparse.Namespace
               ) -> tuple[float, float, float, float]:  # fmt: skip
    """(img/s, ms a step, peak GiB, warm-up s) of fp16 training steps (forward and backward) in ``mode``."""
    name, _, tuned = mode.partition(":")
    if name == "eager":
        run = model
    elif tuned:  # as the application's model.compile_tuning: the mode's options plus coordinate-descent tuning
        options = {**torch._inductor.list_mode_options(name, False), "coordinate_descent_tuning": True}
        run = torch.compile(model, options=options, dynamic=False)
    else:
        run = torch.compile(model, mode=None if name == "default" else name, dynamic=False)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        train_step(run, x, target, torch.float16)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        train_step(run, x, target, torch.float16)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / args.iters
    return args.batch / ms * 1e3, ms, torch.cuda.max_memory_allocated() / 2**30, warm_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default="eager,default",
                    help="eager, default (torch.compile), reduce-overhead; MODE:tuned adds coordinate-descent tuning "
                    "(the application's model.compile_tuning)")  # fmt: skip
    ap.add_argument("--models", default="torchvision,fused", help="torchvision, fused or both, timed in this order")
    ap.add_argument("--fe-path", default=None, help="directory holding the cudnn frontend package (pip --target)")
    args = ap.parse_args()
    if not args.models or any(m.strip() not in ("torchvision", "fused") for m in args.models.split(",")):
        ap.error(f"--models {args.models!r}: give torchvision, fused or torchvision,fused")
    cudnn = import_frontend("cudnn_fused_resnet", args.fe_path)
    if cudnn is None:
        return 2
    _FE["cudnn"], _FE["handle"] = cudnn, cudnn.create_handle()
    torch.backends.cudnn.benchmark = True
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"frontend {cudnn.__version__}; batch {args.batch}, fp16 autocast, channels_last, forward and backward, "
          "no optimizer")  # fmt: skip

    torch.manual_seed(0)
    base = torchvision.models.resnet50().cuda().to(memory_format=CL)
    fused = fuse(base, torch.float16)
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", generator=generator).contiguous(memory_format=CL)
    target = torch.randint(0, 1000, (args.batch,), device="cuda", generator=generator)

    # Correctness first: both fp16 models against fp32 torchvision on the same batch and weights.
    reference = copy.deepcopy(base)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    losses = {"fp32 reference": train_step(reference, x, target, None)}
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    losses["torchvision fp16"] = train_step(base, x, target, torch.float16)
    losses["fused fp16"] = train_step(fused, x, target, torch.float16)
    print(f"convolutions through cuDNN's fused graph: {sum(v is not None for v in _GRAPHS.values())} shapes of "
          f"{len(_GRAPHS)} (the rest computed in torch)")  # fmt: skip
    names = ["conv1.weight", "layer1.0.conv2.weight", "layer2.0.bn1.weight", "layer3.3.conv1.weight",
             "layer4.2.bn3.bias", "fc.weight"]  # fmt: skip
    errors = {label: relative_errors(m, reference, names) for label, m in (("torchvision", base), ("fused", fused))}
    print("loss: " + ", ".join(f"{k} {float(v):.5f}" for k, v in losses.items()))
    # Not a test: through the whole untrained network fp16's rounding grows to ~0.75 of the early layers' gradients
    # for torchvision too; the blocks below are each checked alone.
    print(f"{'network gradient, not checked':32} {'torchvision fp16':>17} {'fused fp16':>11}")
    for n in names:
        print(f"{n:32} {errors['torchvision'][n]:17.2e} {errors['fused'][n]:11.2e}")
    loss_gap = abs(float(losses["fused fp16"] - losses["fp32 reference"]))
    blocks_ok = check_blocks(base, args.batch)
    if not blocks_ok or loss_gap > 3 * abs(float(losses["torchvision fp16"] - losses["fp32 reference"])) + 1e-3:
        print(f"cudnn_fused_resnet: the fused model is off (blocks {'ok' if blocks_ok else 'off: !'}, loss gap "
              f"{loss_gap:.2e}); no timing")  # fmt: skip
        return 1

    rows = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        for label in [m.strip() for m in args.models.split(",") if m.strip()]:
            model = {"torchvision": base, "fused": fused}[label]
            try:
                rows.append((mode, label, *time_steps(model, mode, x, target, args)))
            except Exception as error:  # noqa: BLE001 - one mode's failure (a compile, a capture) stops no other
                print(f"  {mode} {label} failed: {type(error).__name__}: {' '.join(str(error).split())[:600]}")
                continue
            print(f"  {mode} {label}: {rows[-1][2]:,.0f} img/s ({rows[-1][3]:.2f} ms a step; warm-up "
                  f"{rows[-1][5]:.0f} s)", flush=True)  # fmt: skip
    print(f"\n| mode | model | img/s (fwd+bwd) | ms/step | fused/torchvision | peak GiB |\n|{'---|' * 6}")
    for mode, label, rate, ms, peak, _ in rows:
        tv = next((r[2] for r in rows if r[0] == mode and r[1] == "torchvision"), None)
        ratio = "" if tv is None else f"{rate / tv:.3f}"
        print(f"| {mode} | {label} | {rate:,.0f} | {ms:.2f} | {ratio} | {peak:.1f} |")
    _GRAPHS.clear()  # the frontend's objects before the interpreter's end, where nanobind reports them as leaked
    _FE.update(cudnn=None, handle=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
