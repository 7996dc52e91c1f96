"""Probe: what would MLPerf-style conv+BN fusion save for ResNet-50 convs, forward and backward?

Layer x -> a = relu(x*s+b) (previous BN folded) -> y = conv(a, w) -> BN stats of y. Per shape, torch eager and
torch.compile baselines vs cuDNN frontend graphs. Forward: scale/bias/relu prologue + conv_fprop + genstats
(NVIDIA/cudnn-frontend test/python/conv/graph/test_conv_genstats.py). Backward from dy (stats are of y.detach(): their
backward is the next BN's, the same in both designs): torch autograd grads of x, s, b, w (fwd+bwd and bwd alone) vs
a dgrad graph, conv_dgrad -> relu_backward on z = x*s+b recomputed in the graph + sum(dz), sum(dz*x) as reductions
(samples/cpp/convolution/dgrads.cpp, test/python/conv/graph/test_conv_reduction.py; the previous BN's dbias, and
dscale = invstd*(sum(dz*x) - mean*sum(dz))), plus a wgrad graph, conv_wgrad on relu(x*s+b) built in its prologue
(test/python/conv/graph/test_wgrads.py). Unbuildable graphs fall back to: no sums, a stored z, a plain wgrad on a
stored a (reported; a stored tensor's forward write is not timed). Every cuDNN output is checked against an fp32
reference before it is timed.

The cuDNN frontend's Python bindings are not a dependency of the application: on a GPU machine without internet, carry
the wheel (its other requirements, cutlass-dsl and tvm-ffi, are not needed for these graphs: --no-deps):

    pip download nvidia-cudnn-frontend==1.32.0 --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d whl                     # where pip reaches PyPI; the GPU's Python
    pip install --no-deps --no-index --target /tmp/fe whl/nvidia_cudnn_frontend-*.whl
    python bench/cudnn_fusion_probe.py --fe-path /tmp/fe            # fp16; --dtype bf16 has no engine on sm_90
"""

import argparse
import importlib.util
import sys
import time

import torch
import torch.nn.functional as F

# (name, Cin, Cout, H=W, kernel, padding): representative ResNet-50 (v1.5) stride-1 convs.
SHAPES = [
    ("l1 1x1 256->64 @56", 256, 64, 56, 1, 0),
    ("l1 3x3 64->64 @56", 64, 64, 56, 3, 1),
    ("l1 1x1 64->256 @56", 64, 256, 56, 1, 0),
    ("l2 3x3 128->128 @28", 128, 128, 28, 3, 1),
    ("l3 1x1 1024->256 @14", 1024, 256, 14, 1, 0),
    ("l4 3x3 512->512 @7", 512, 512, 7, 3, 1),
]
EPS = 1e-5
Y_TOL, STAT_TOL = 2e-2, 5e-3  # bf16 output rounding is ~4e-3 of |y|max; sums are fp32
AMBIG = 1e-2  # |z| below this: fp32 reference and cuDNN may disagree on the ReLU mask; left out of the dz error
SLEEP_CYCLES_PER_ITER = 1_000_000  # ~0.5 ms of GPU spin per timed iteration (see gpu_time)
DEV = "cuda"


def gpu_time(fn, iters, warmup):
    """(GPU ms/iter, host ms/iter). A spin kernel is queued first so the CPU can enqueue
    every iteration before the GPU reaches them: the events then measure GPU time,
    not Python launch overhead (host time is returned separately to show that cost)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(SLEEP_CYCLES_PER_ITER * iters)
    start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / iters
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters, host_ms


def attempt(label, fn):
    """Run one stage; on any failure print why and return None, so one shape never
    stops the probe."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - cuDNN raises several types; all mean "skip"
        print(f"  [{label}] failed: {type(e).__name__}: {' '.join(str(e).split())[:1000]}")
        return None


# ---- (a) PyTorch baselines -------------------------------------------------
def apply_conv(x, s, b, w, pad):
    # previous BN folded to per-channel scale/bias (what BN-apply computes), then ReLU
    xa = torch.relu_(torch.addcmul(b, x, s))
    return F.conv2d(xa, w, padding=pad)


def base_eager(x, s, b, w, pad):
    y = apply_conv(x, s, b, w, pad)
    # one-pass Welford stats: the statistics half of BN training, no normalized write
    mean, invstd = torch.batch_norm_stats(y, EPS)
    return y, mean, invstd


def base_eager_bn(x, s, b, w, pad, bn):
    # F.batch_norm(training) also writes normalized y: that pass belongs to the next
    # layer's "apply", so this column double-counts it; shown for reference only.
    # bn = fp32 (weight, bias, running_mean, running_var), as BatchNorm2d holds them.
    y = apply_conv(x, s, b, w, pad)
    return F.batch_norm(y, bn[2], bn[3], bn[0], bn[1], training=True, momentum=0.1, eps=EPS)


def base_compiled_fn(x, s, b, w, pad):
    # what inductor emits per layer in the project: fused apply kernel, extern cuDNN
    # conv, one reduction kernel for the stats (fp32 accumulation, cast fused in)
    y = apply_conv(x, s, b, w, pad)
    var, mean = torch.var_mean(y.float(), dim=(0, 2, 3), correction=0)
    return y, mean, var


def train_fwd(x, s, b, w, pad, eager=False):
    # training forward for the backward baselines: stats of y.detach() (see the module doc)
    y = apply_conv(x, s, b, w, pad)
    if eager:
        return (y, *torch.batch_norm_stats(y.detach(), EPS))
    var, mean = torch.var_mean(y.detach().float(), dim=(0, 2, 3), correction=0)
    return y, mean, var


def fwd_bwd_times(label, fwd, leaves, dy, its):
    """(forward+backward, backward alone) GPU times of the grads of leaves from dy."""
    fb = attempt(f"{label} fwd+bwd", lambda: gpu_time(lambda: torch.autograd.grad(fwd(*leaves)[0], leaves, dy), *its))
    y = attempt(f"{label} fwd", lambda: fwd(*leaves)[0])
    bwd = y is not None and attempt(
        f"{label} bwd", lambda: gpu_time(lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True), *its)
    )
    return fb, bwd or None


# ---- (b) cuDNN frontend graphs ---------------------------------------------
def inp(g, pack, t, name, dt):  # a graph input describing the real torch buffer t[name.lower()] (NHWC strides)
    v = t[name.lower()]
    T = g.tensor(name=name, dim=list(v.shape), stride=list(v.stride()), data_type=dt)
    pack[T] = v
    return T


def out(pack, T, v, dt):  # a graph output written into torch buffer v: its dims, strides and type
    pack[T.set_output(True).set_dim(list(v.shape)).set_stride(list(v.stride())).set_data_type(dt)] = v
    return T


def affine(g, X, S, B):  # z = x*s + b, the folded BN apply, as the frontend's scale and bias ops
    return g.bias(name="bias", input=g.scale(name="scale", input=X, scale=S), bias=B)


def finish(cudnn, g, autotune):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(*([cudnn.build_plan_policy.ALL] if autotune else []))


def build_fused(cudnn, handle, io_dt, t, pad, autotune):
    f32 = cudnn.data_type.FLOAT
    # intermediate type = io type, as in the frontend's own test: the relu output is
    # the conv's input operand, so it must be bf16/fp16 for the tensor-core MMA.
    g, pack = cudnn.pygraph(io_data_type=io_dt, intermediate_data_type=io_dt, compute_data_type=f32, handle=handle), {}
    X, W, S, B = (inp(g, pack, t, n, io_dt) for n in "XWSB")
    conv_in = g.relu(name="relu", input=affine(g, X, S, B))
    Y = g.conv_fprop(image=conv_in, weight=W, padding=[pad, pad], stride=[1, 1], dilation=[1, 1], name="conv")
    Y.set_output(True).set_data_type(io_dt)
    SUM, SQ_SUM = (T.set_output(True).set_data_type(f32) for T in g.genstats(name="genstats", input=Y))
    finish(cudnn, g, autotune)
    return g, {**pack, Y: t["y"], SUM: t["ssum"], SQ_SUM: t["ssq"]}


def build_dgrad(cudnn, handle, io_dt, t, pad, autotune, recompute, sums):
    # conv_dgrad -> relu_backward(loss=da, input=z): dgrads.cpp "Dgrad Drelu Graph" (stored z) and the
    # z = x*s+b pointwise chain of its "Dgrad Drelu DBNweight Graph"; sums: graph.reduction(ADD)
    f32, add = cudnn.data_type.FLOAT, cudnn.reduction_mode.ADD
    g, pack = cudnn.pygraph(io_data_type=io_dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle), {}
    DY, W = inp(g, pack, t, "DY", io_dt), inp(g, pack, t, "W", io_dt)
    DA = g.conv_dgrad(loss=DY, filter=W, padding=[pad, pad], stride=[1, 1], dilation=[1, 1], name="dgrad")
    DA.set_dim(list(t["x"].shape)).set_stride(list(t["x"].stride()))
    X = inp(g, pack, t, "X", io_dt) if recompute or sums else None
    Z = affine(g, X, *(inp(g, pack, t, n, io_dt) for n in "SB")) if recompute else inp(g, pack, t, "Z", io_dt)
    DZ = out(pack, g.relu_backward(loss=DA, input=Z, name="drelu"), t["dz"], io_dt)
    if sums:
        out(pack, g.reduction(input=DZ, mode=add, name="sum_dz"), t["sdz"], f32)
        out(pack, g.reduction(input=g.mul(a=DZ, b=X, name="dz_x"), mode=add, name="sum_dzx"), t["sdzx"], f32)
    finish(cudnn, g, autotune)
    return g, pack


def build_wgrad(cudnn, handle, io_dt, t, pad, autotune, recompute, inter_dt):
    # conv_wgrad(image=relu(x*s+b) in its prologue, loss=dy): test_wgrads.py (intermediate FLOAT there);
    # else a plain conv_wgrad on a stored a = relu(x*s+b)
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io_dt, intermediate_data_type=inter_dt, compute_data_type=f32, handle=handle)
    pack = {}
    if recompute:
        A = g.relu(name="relu", input=affine(g, *(inp(g, pack, t, n, io_dt) for n in "XSB")))
    else:
        A = inp(g, pack, t, "A", io_dt)
    DY = inp(g, pack, t, "DY", io_dt)
    DW = g.conv_wgrad(image=A, loss=DY, padding=[pad, pad], stride=[1, 1], dilation=[1, 1], name="wgrad")
    out(pack, DW, t["dw"], io_dt)
    finish(cudnn, g, autotune)
    return g, pack


def plan_runner(g, pack, handle, autotune):
    """(run, plan description): execute() runs the plan build_plans() selected; --autotune pins the fastest."""
    index = None
    if autotune:
        times = {}
        for i in range(g.get_execution_plan_count()):

            def one(i=i):
                ws_i = torch.empty(max(g.get_workspace_size_plan_at_index(i), 1), device=DEV, dtype=torch.uint8)
                return gpu_time(lambda: g.execute_plan_at_index(pack, ws_i, index=i, handle=handle), 10, 3)[0]

            t = attempt(f"plan {i}", one)
            if t is not None:
                times[i] = t
                print(f"  plan {i} {attempt('name', lambda i=i: g.get_plan_name_at_index(i))}: {t:.3f} ms")
        index = min(times, key=times.get) if times else None
    wsz = g.get_workspace_size() if index is None else g.get_workspace_size_plan_at_index(index)
    ws = torch.empty(max(wsz, 1), device=DEV, dtype=torch.uint8)
    plan_name = attempt("plan name", lambda: g.get_plan_name_at_index(index if index is not None else g._plan_index))

    def run():
        g.execute(pack, ws, handle=handle) if index is None else g.execute_plan_at_index(pack, ws, index, handle)

    return run, f"{plan_name} ws={wsz}B"


def rel(a, ref, denom, skip=None):
    if not torch.isfinite(a).all():  # before the mask: a NaN left from the fill is an element never written
        return float("inf")
    d = (a.float() - ref).abs()
    d = d if skip is None else d.masked_fill(skip, 0)
    return float((d / denom).max())


def probe_graph(key, r, build, variants, checks, handle, args):
    """Build the first variant that builds, check every output it writes, time it if all pass.
    variants: [(label, code, build kwargs)]; checks: [(name, out, ref, denom, tol, skip, is_sum)]:
    sums are zeroed, other outputs NaN-filled (proves the graph wrote every element) before the check."""
    for label, code, kw in variants:  # noqa: B007 - the variant that built is used after the loop
        built = attempt(f"{key} build [{label}]", lambda kw=kw: build(**kw))
        if built is not None:
            break
    else:
        r[key + "_note"] = "no variant built (see above)"
        return
    g, pack = built
    r[key + "_variant"], r[key + "_code"] = label, code
    outs = [c for c in checks if any(c[1] is v for v in pack.values())]
    sums = [c[1] for c in outs if c[6]]
    runner = attempt(f"{key} plan", lambda: plan_runner(g, pack, handle, args.autotune))
    if runner is None:
        return
    run, r[key + "_plan"] = runner

    def check():
        for c in outs:
            c[1].zero_() if c[6] else c[1].fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        errs = {c[0]: (rel(*c[1:4], c[5]), c[4]) for c in outs}
        if not sums:
            return errs, False
        q1 = sums[-1].clone()
        run()  # again without zeroing: do the sums overwrite or accumulate?
        torch.cuda.synchronize()
        return errs, bool(torch.allclose(sums[-1], 2 * q1, rtol=1e-3)) and not bool(
            torch.allclose(sums[-1], q1, rtol=1e-3)
        )

    chk = attempt(f"{key} execute", check)
    if chk is None:
        r[key + "_note"] = "execute failed"
        return
    errs, accum = chk
    r[key + "_err"] = " ".join(f"{n} {e:.1e}" for n, (e, _) in errs.items())
    r[key + "_ok"] = all(e <= tol for e, tol in errs.values())
    if not r[key + "_ok"]:
        print(f"  [{key}] numerics FAILED ({r[key + '_err']}; limits out {Y_TOL}, sums {STAT_TOL}): not timed")
        return
    if accum:  # outputs must be cleared before each call: time that memset too
        r[key + "_note"] = "sums ACCUMULATE into their outputs: timed with a zero_() of each"
    timed = (lambda: ([t.zero_() for t in sums], run())) if accum else run
    r[key] = attempt(f"{key} timing", lambda: gpu_time(timed, args.iters, args.warmup))


def probe_shape(cudnn, handle, args, tname, dt, io_dt, shape):
    name, cin, cout, hw, k, pad = shape
    dev, cl, f32 = DEV, torch.channels_last, cudnn.data_type.FLOAT
    g0 = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(args.batch, cin, hw, hw, device=dev, generator=g0).to(dt).contiguous(memory_format=cl)
    w = torch.randn(cout, cin, k, k, device=dev, generator=g0) * (2.0 / (cin * k * k)) ** 0.5
    w = w.to(dt).contiguous(memory_format=cl)
    s = (1.0 + 0.2 * torch.randn(1, cin, 1, 1, device=dev, generator=g0)).to(dt).contiguous(memory_format=cl)
    b = (0.2 * torch.randn(1, cin, 1, 1, device=dev, generator=g0)).to(dt).contiguous(memory_format=cl)
    dy = torch.randn(args.batch, cout, hw, hw, device=dev, generator=g0).to(dt).contiguous(memory_format=cl)
    r = {"shape": f"{name} {tname}"}
    # fp32 reference (torch.autograd.grad); conv input rounded to the io dtype like the fused prologue's output
    torch.backends.cudnn.allow_tf32 = False
    z32 = (x.float() * s.float() + b.float()).requires_grad_()
    w32 = w.float().requires_grad_()
    y_ref = F.conv2d(torch.relu(z32).to(dt).float(), w32, padding=pad)
    dz_ref, dw_ref = torch.autograd.grad(y_ref, [z32, w32], dy.float())
    y_ref, skip, dzx = y_ref.detach(), z32.detach().abs() < AMBIG, dz_ref * x.float()
    del z32, w32
    red = {"dim": (0, 2, 3), "keepdim": True}
    sum_ref, sq_ref = y_ref.sum(**red), (y_ref * y_ref).sum(**red).clamp_min(1e-12)
    abs_ref = y_ref.abs().sum(**red).clamp_min(1e-12)  # |sum| can cancel to ~0: scale by sum|y|
    sdz_ref, sdz_abs = dz_ref.sum(**red), dz_ref.abs().sum(**red).clamp_min(1e-12)
    sdzx_ref, sdzx_abs = dzx.sum(**red), dzx.abs().sum(**red).clamp_min(1e-12)
    del dzx
    torch.backends.cudnn.allow_tf32 = True
    if not torch.addcmul(b, x, s).is_contiguous(memory_format=cl):
        print("  warning: addcmul output is not channels_last; the torch baselines pay a layout change")
    base_err = attempt("eager", lambda: rel(base_eager(x, s, b, w, pad)[0], y_ref, y_ref.abs().max()))
    its = (args.iters, args.warmup)
    r["conv"] = attempt("conv-only", lambda: gpu_time(lambda: F.conv2d(x, w, padding=pad), *its))
    r["eager"] = attempt("eager", lambda: gpu_time(lambda: base_eager(x, s, b, w, pad), *its))
    bn = [torch.full((cout,), v, device=dev) for v in (1.0, 0.0, 0.0, 1.0)]
    r["eager_bn"] = attempt("eager+BN", lambda: gpu_time(lambda: base_eager_bn(x, s, b, w, pad, bn), *its))
    if not args.no_compile:
        cfn = torch.compile(base_compiled_fn, dynamic=False)
        r["compiled"] = attempt("compiled", lambda: gpu_time(lambda: cfn(x, s, b, w, pad), *its))
    sums = {
        k: torch.zeros(1, c, 1, 1, device=dev).contiguous(memory_format=cl)  # fp32 per-channel sums
        for k, c in (("ssum", cout), ("ssq", cout), ("sdz", cin), ("sdzx", cin))
    }
    t = {
        "x": x,
        "w": w,
        "s": s,
        "b": b,
        "dy": dy,
        "y": torch.empty_like(dy),
        "dz": torch.empty_like(x),
        "dw": torch.empty_like(w),
        **sums,
    }
    fwd_checks = [
        ("y", t["y"], y_ref, y_ref.abs().max(), Y_TOL, None, False),
        ("sum", t["ssum"], sum_ref, abs_ref, STAT_TOL, None, True),
        ("sq", t["ssq"], sq_ref, sq_ref, STAT_TOL, None, True),
    ]
    probe_graph(
        "fused",
        r,
        lambda: build_fused(cudnn, handle, io_dt, t, pad, args.autotune),
        [("scale-bias-relu + conv_fprop + genstats", "F", {})],
        fwd_checks,
        handle,
        args,
    )
    if "fused_err" in r:
        r["fused_err"] += f" (torch {tname} path: y {base_err or float('nan'):.1e})"
    if args.no_backward:
        return r
    leaves = [v.detach().clone().requires_grad_() for v in (x, s, b, w)]
    ge = attempt("eager grads", lambda: torch.autograd.grad(train_fwd(*leaves, pad, True)[0], leaves, dy))
    bwd_base_err = rel(ge[3], dw_ref, dw_ref.abs().max()) if ge else float("nan")
    r["fb_eager"], r["bwd_eager"] = fwd_bwd_times("eager", lambda *v: train_fwd(*v, pad, True), leaves, dy, its)

    def compiled_times():  # donated buffers forbid the retain_graph of the bwd-alone timing (memory reuse only)
        with torch._functorch.config.patch(donated_buffer=False):
            ctrain = torch.compile(train_fwd, dynamic=False)
            return fwd_bwd_times("compiled", lambda *v: ctrain(*v, pad), leaves, dy, its)

    if not args.no_compile:
        r["fb_comp"], r["bwd_comp"] = attempt("compiled training", compiled_times) or (None, None)
    t["z"] = torch.addcmul(b, x, s)  # stored pre-activation / activation: fallback variants only
    t["a"] = torch.relu(t["z"])
    dgrad_checks = [
        ("dz", t["dz"], dz_ref, dz_ref.abs().max(), Y_TOL, skip, False),
        ("sum_dz", t["sdz"], sdz_ref, sdz_abs, STAT_TOL, None, True),
        ("sum_dzx", t["sdzx"], sdzx_ref, sdzx_abs, STAT_TOL, None, True),
    ]
    dgrad_variants = [
        (
            f"dgrad + dReLU({'z=x*s+b in graph' if rc else 'STORED z'}){' + sums' if sm else ', NO sums'}",
            ("Z" if rc else "z*") + ("+S" if sm else ""),
            {"recompute": rc, "sums": sm},
        )
        for rc in (True, False)
        for sm in (True, False)
    ]  # preferred first
    if args.dgrad_variant:  # that one alone: where the dgrad graph's time goes (the sums, the recomputed z)
        dgrad_variants = [v for v in dgrad_variants if v[1] == args.dgrad_variant]
    probe_graph(
        "dgrad",
        r,
        lambda **kw: build_dgrad(cudnn, handle, io_dt, t, pad, args.autotune, **kw),
        dgrad_variants,
        dgrad_checks,
        handle,
        args,
    )
    probe_graph(
        "wgrad",
        r,
        lambda **kw: build_wgrad(cudnn, handle, io_dt, t, pad, args.autotune, **kw),
        [
            ("wgrad(relu(x*s+b) prologue), fp32 intermediate", "R32", {"recompute": True, "inter_dt": f32}),
            ("wgrad(relu(x*s+b) prologue), io intermediate", "R16", {"recompute": True, "inter_dt": io_dt}),
            ("plain wgrad on STORED a", "a*", {"recompute": False, "inter_dt": io_dt}),
        ],
        [("dw", t["dw"], dw_ref, dw_ref.abs().max(), Y_TOL, None, False)],
        handle,
        args,
    )
    if "wgrad_err" in r:
        r["wgrad_err"] += f" (torch {tname} path: dw {bwd_base_err:.1e})"
    return r


def fmt(t):
    return f"{t[0]:8.3f}" if t else "     n/a"


def import_frontend(script, fe_path):
    """The cuDNN frontend module (from ``fe_path`` first when given), or None after saying why ``script`` cannot run:
    no CUDA GPU, or no frontend to import."""
    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU (torch.cuda.is_available() is False); nothing to measure.")
        return None
    if fe_path:
        sys.path.insert(0, fe_path)
    try:
        import cudnn  # after torch, so the frontend dlopens the libcudnn torch already loaded
    except Exception as e:  # noqa: BLE001
        print(
            f"{script}: cannot import the cuDNN frontend ({type(e).__name__}: {e}).\n"
            "  install: pip install --no-deps nvidia_cudnn_frontend-1.32.0-cp312-*.whl (or --fe-path DIR)"
        )
        return None
    return cudnn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument(
        "--dtype", default="fp16", help="fp16, bf16 or a list: fp16,bf16 (cuDNN 9.19 sm_90: no bf16 engine)"
    )
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--autotune", action="store_true", help="build every cuDNN plan, time each, keep the fastest")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--no-backward", action="store_true", help="forward part only")
    ap.add_argument(
        "--dgrad-variant",
        choices=("Z+S", "Z", "z*+S", "z*"),
        help="build only this dgrad graph (Z: z = x*s+b recomputed in the graph, z*: a stored z; +S: the previous "
        "BN's two sums fused); default: the first of them that builds, in that order",
    )
    ap.add_argument("--no-cudnn-benchmark", action="store_true", help="leave torch.backends.cudnn.benchmark off")
    ap.add_argument("--fe-path", default=None, help="directory holding the cudnn frontend package (pip --target)")
    args = ap.parse_args()

    cudnn = import_frontend("cudnn_fusion_probe", args.fe_path)
    if cudnn is None:
        return 2

    dtypes = {"bf16": (torch.bfloat16, cudnn.data_type.BFLOAT16), "fp16": (torch.float16, cudnn.data_type.HALF)}
    names = [d.strip() for d in args.dtype.split(",") if d.strip()]
    if not names or any(d not in dtypes for d in names):
        print(f"cudnn_fusion_probe: unknown --dtype {args.dtype}; use fp16, bf16 or fp16,bf16")
        return 2
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    dyn = torch._dynamo.config  # one recompile per shape, dtype and grad mode: lift the default limit of 8
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(dyn, knob):
            setattr(dyn, knob, 64)
    bver = attempt("backend_version", cudnn.backend_version) if hasattr(cudnn, "backend_version") else "n/a"
    print(
        f"GPU: {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})\n"
        f"torch {torch.__version__} (CUDA {torch.version.cuda}, torch's cuDNN {torch.backends.cudnn.version()}); "
        f"cudnn frontend {cudnn.__version__}; cuDNN backend seen by frontend {bver}"
    )
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        print("note: no cuda-python (cuda.bindings); the frontend's cuDNN-backend path with our handle avoids it")
    print(
        f"batch {args.batch}, iters {args.iters}, warmup {args.warmup}, "
        f"cudnn.benchmark {torch.backends.cudnn.benchmark}"
    )
    handle = attempt("cudnn.create_handle", cudnn.create_handle)
    if handle is None:
        return 2
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)  # same stream as the events
    rows = []
    for tname in names:
        dt, io_dt = dtypes[tname]
        for shape in SHAPES:
            print(f"== {shape[0]} {tname}", flush=True)
            r = attempt("shape", lambda a=(tname, dt, io_dt, shape): probe_shape(cudnn, handle, args, *a))
            rows.append(r or {"shape": f"{shape[0]} {tname}", "note": "probe failed"})
            for key in [g + k for g in ("fused", "dgrad", "wgrad") for k in ("_variant", "_plan", "_err", "_note")]:
                if r and key in r:
                    print(f"  {key}: {r[key]}")
            torch.cuda.empty_cache()
    report(rows)
    if not args.no_backward:
        report_bwd(rows)
    return 0


def report(rows):
    print(
        "\nFORWARD, GPU ms per call (eager = apply+conv+batch_norm_stats; eager+BN = apply+conv+F.batch_norm incl. "
        "normalized write; compiled = torch.compile of apply+conv+var_mean; fused = one cuDNN graph)"
    )
    hdr = (
        f"{'shape':<26}{'conv':>9}{'eager':>9}{'eager+BN':>9}{'compiled':>9}{'fused':>9}"
        f"{'f/eager':>8}{'f/comp':>8}{'host us':>8}  numerics"
    )
    print(hdr)
    print("-" * len(hdr))
    tot, full = totals(rows, ("conv", "eager", "compiled", "fused"))  # over shapes that have all four
    n_tot = len(full)
    for r in rows:
        fu, ea, co = r.get("fused"), r.get("eager"), r.get("compiled")
        fe = f"{fu[0] / ea[0]:8.2f}" if fu and ea else "     n/a"
        fc = f"{fu[0] / co[0]:8.2f}" if fu and co else "     n/a"
        host = f"{fu[1] * 1e3:8.0f}" if fu else "     n/a"
        ok = {True: "ok", False: "FAIL"}.get(r.get("fused_ok"), "n/a")
        print(
            f"{r['shape']:<26}{fmt(r.get('conv')):>9}{fmt(ea):>9}{fmt(r.get('eager_bn')):>9}{fmt(co):>9}"
            f"{fmt(fu):>9}{fe}{fc}{host}  {ok}"
        )
    if n_tot:
        print(
            f"{'TOTAL (' + str(n_tot) + ' shapes)':<26}{tot['conv']:9.3f}{tot['eager']:9.3f}{'':>9}"
            f"{tot['compiled']:9.3f}{tot['fused']:9.3f}{tot['fused'] / tot['eager']:8.2f}"
            f"{tot['fused'] / tot['compiled']:8.2f}"
        )
        print(
            f"fused saves {tot['compiled'] - tot['fused']:.3f} ms vs compiled over these shapes "
            f"(conv alone: {tot['conv']:.3f} ms, so the BN/ReLU passes cost {tot['compiled'] - tot['conv']:.3f} ms "
            f"in the compiled baseline and {tot['fused'] - tot['conv']:.3f} ms fused)"
        )
    else:
        print("no shape has all four timings (fused graph unsupported or failing, or --no-compile): see above")


def totals(rows, keys):
    """The GPU ms of each of ``keys`` summed over the rows that have a timing for every one of them, and those rows."""
    full = [r for r in rows if all(r.get(key) for key in keys)]
    return {key: sum(r[key][0] for r in full) for key in keys}, full


def report_bwd(rows):
    print(
        "\nBACKWARD, GPU ms per call (torch: autograd grads of x,s,b,w from dy, fwd+bwd or bwd alone; cuDNN: dgrad "
        "graph + wgrad graph; variants: dgrad Z = z recomputed in the graph, z* = STORED z, +S = sums fused; wgrad "
        "R32/R16 = relu(x*s+b) in its prologue (fp32/io intermediate), a* = STORED a; a stored tensor's write is "
        "untimed)"
    )
    hdr = (
        f"{'shape':<26}{'eag f+b':>9}{'eag bwd':>9}{'cmp f+b':>9}{'cmp bwd':>9}{'dgrad':>9}{'wgrad':>9}"
        f"{'d+w':>9}{'/e bwd':>7}{'/c bwd':>7}  variants numerics"
    )
    print(hdr)
    print("-" * len(hdr))
    tot, full = totals(rows, ("compiled", "bwd_comp", "fb_comp", "fused", "dgrad", "wgrad"))
    n_tot = len(full)
    fallback = sum(r["dgrad_code"] != "Z+S" or r["wgrad_code"] == "a*" for r in full)
    for r in rows:
        dg, wg, eb, cb = r.get("dgrad"), r.get("wgrad"), r.get("bwd_eager"), r.get("bwd_comp")
        dw = (dg[0] + wg[0], 0.0) if dg and wg else None
        ratio = [f"{dw[0] / base[0]:7.2f}" if dw and base else "    n/a" for base in (eb, cb)]
        oks = "/".join({True: "ok", False: "FAIL"}.get(r.get(k + "_ok"), "n/a") for k in ("dgrad", "wgrad"))
        print(
            f"{r['shape']:<26}{fmt(r.get('fb_eager')):>9}{fmt(eb):>9}{fmt(r.get('fb_comp')):>9}{fmt(cb):>9}"
            f"{fmt(dg):>9}{fmt(wg):>9}{fmt(dw):>9}{ratio[0]}{ratio[1]}  "
            f"{r.get('dgrad_code', '-')}/{r.get('wgrad_code', '-')} {oks}"
        )
    if not n_tot:
        print("no shape has compiled + cuDNN timings for both directions (unsupported, failing or --no-compile)")
        return
    t_bwd, c_bwd = tot["dgrad"] + tot["wgrad"], tot["bwd_comp"]
    print(
        f"{'TOTAL (' + str(n_tot) + ' shapes)':<26}{'':>27}{c_bwd:9.3f}{tot['dgrad']:9.3f}{tot['wgrad']:9.3f}"
        f"{t_bwd:9.3f}{'':>7}{t_bwd / c_bwd:7.2f}"
    )
    t_c, t_f = tot["compiled"] + c_bwd, tot["fused"] + t_bwd
    print(
        f"FWD+BWD over {n_tot} shapes: torch compiled {t_c:.3f} ms (fwd {tot['compiled']:.3f} + bwd {c_bwd:.3f}; "
        f"measured together {tot['fb_comp']:.3f}) vs cuDNN fused {t_f:.3f} ms (fwd {tot['fused']:.3f} + dgrad "
        f"{tot['dgrad']:.3f} + wgrad {tot['wgrad']:.3f}): {t_f / t_c:.2f}x, saves {t_c - t_f:.3f} ms"
    )
    if fallback:
        print(
            f"caveat: {fallback} of these shapes used a fallback variant (no sums, or a stored z / a whose forward "
            "write is not timed): the cuDNN side is optimistic there"
        )


if __name__ == "__main__":
    sys.exit(main())
