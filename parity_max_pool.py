"""The ResNet stem's 3x3 stride-2 max pool, with a backward written as four dense parity planes.

torch.compile lowers ``max_pool2d``'s backward to a gather: every input pixel looks up the (up to four) pooled outputs
whose windows cover it, through indirect loads of the saved indices. On an H200 that one kernel of compiled ResNet-50
(fused with the add of the two branches' gradients) took 1.47 ms a step, several times what its bytes need.

With kernel 3, stride 2 and padding 1, which pooled outputs cover an input pixel depends only on the parity of its
row and column: an even row ``2a`` lies in window ``a`` only (as its middle row), an odd row ``2a + 1`` in windows
``a`` (last row) and ``a + 1`` (first row). So the input gradient is four planes, each a sum of one to four dense,
shifted, masked copies of the pooled gradient, interleaved: plain pointwise work without indirect indexing.

The forward takes the maximum over the window's nine taps in row-major order, first maximum wins, and saves which
tap won (one byte per output), as ATen's kernel does: values and gradients equal ``F.max_pool2d``'s, up to the order
in which the up-to-four contributions to one pixel are added. (Differences: a window whose maximum is NaN or
``-inf`` may pick another tap than ATen.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Tap ``3 * dh + dw`` of a window is padded-input pixel ``(2 * oh + dh, 2 * ow + dw)``.
_TAPS = tuple((dh, dw) for dh in range(3) for dw in range(3))


def _pooled_size(n: int) -> int:
    return (n - 1) // 2 + 1


def _next(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` moved back by one along ``dim`` (element ``a`` takes ``a + 1``), zero past the end."""
    n = t.shape[dim]
    shifted = t.narrow(dim, 1, n - 1)
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, 1]
    return F.pad(shifted, pad)


class _ParityMaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ho, wo = _pooled_size(h), _pooled_size(w)
        # channels_last in, channels_last out: work in (N, H, W, C) order, C innermost, as the memory is laid out.
        ctx.channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        if ctx.channels_last:
            padded = F.pad(x.permute(0, 2, 3, 1), (0, 0, 1, 1, 1, 1), value=float("-inf"))
            taps = [padded[:, dh : dh + 2 * ho - 1 : 2, dw : dw + 2 * wo - 1 : 2] for dh, dw in _TAPS]
        else:
            padded = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
            taps = [padded[..., dh : dh + 2 * ho - 1 : 2, dw : dw + 2 * wo - 1 : 2] for dh, dw in _TAPS]
        values, tap = torch.stack(taps).max(dim=0)
        tap = tap.to(torch.uint8)
        if ctx.channels_last:
            values, tap = values.permute(0, 3, 1, 2), tap.permute(0, 3, 1, 2)
        ctx.save_for_backward(tap)
        ctx.input_size = (h, w)
        return values

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (tap,) = ctx.saved_tensors
        h, w = ctx.input_size
        dtype = grad.dtype
        # Sum in fp32 and round once, as ATen's kernel accumulates (compiled, the casts fuse into the one kernel).
        grad = grad.float()
        # Work in (..., H, W, C) order when the input was channels_last, so the planes and their interleave are laid
        # out as the gradient must be, with C innermost.
        if ctx.channels_last:
            grad, tap = grad.permute(0, 2, 3, 1), tap.permute(0, 2, 3, 1)
            hdim, wdim = 1, 2
        else:
            hdim, wdim = grad.dim() - 2, grad.dim() - 1
        zero = grad.new_zeros(())

        def part(dh: int, dw: int) -> torch.Tensor:
            return torch.where(tap == 3 * dh + dw, grad, zero)

        def below(t: torch.Tensor) -> torch.Tensor:
            return _next(t, hdim)

        def right(t: torch.Tensor) -> torch.Tensor:
            return _next(t, wdim)

        even_even = part(1, 1)
        even_odd = part(1, 2) + right(part(1, 0))
        odd_even = part(2, 1) + below(part(0, 1))
        odd_odd = part(2, 2) + right(part(2, 0)) + below(part(0, 2) + right(part(0, 0)))
        # Interleave: (.., Ho, Wo, ..) planes -> (.., Ho, 2, Wo, 2, ..) -> (.., 2 Ho, 2 Wo, ..), then drop the odd
        # row/column past an odd input's end.
        rows_even = torch.stack((even_even, even_odd), dim=wdim + 1)
        rows_odd = torch.stack((odd_even, odd_odd), dim=wdim + 1)
        both = torch.stack((rows_even, rows_odd), dim=hdim + 1)
        shape = list(grad.shape)
        shape[hdim], shape[wdim] = 2 * shape[hdim], 2 * shape[wdim]
        out = both.reshape(shape).narrow(hdim, 0, h).narrow(wdim, 0, w)
        if ctx.channels_last:
            out = out.permute(0, 3, 1, 2)
        return out.to(dtype)


def parity_max_pool(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, kernel_size=3, stride=2, padding=1)`` with the parity-plane backward."""
    if x.dim() not in (3, 4):
        raise ValueError(f"parity_max_pool: expected a 3-D or 4-D input, got shape {tuple(x.shape)}")
    return _ParityMaxPool.apply(x)


class ParityMaxPool2d(nn.Module):
    """Drop-in for ``nn.MaxPool2d(kernel_size=3, stride=2, padding=1)`` (the ResNet stem's), same results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return parity_max_pool(x)

    def extra_repr(self) -> str:
        return "kernel_size=3, stride=2, padding=1, backward=parity planes"


def replace_stem_pool(model: nn.Module) -> nn.Module:
    """Swaps a torchvision ResNet's ``maxpool`` for :class:`ParityMaxPool2d`, in place.

    Raises:
        ValueError: the model has no ``maxpool`` attribute that is an ``nn.MaxPool2d`` with kernel 3, stride 2,
            padding 1, dilation 1 and floor mode (every torchvision ResNet and ResNeXt has one).
    """
    pool = getattr(model, "maxpool", None)
    want = {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1, "ceil_mode": False}

    def pair(v):
        return v if isinstance(v, tuple) else (v, v)

    ok = (
        isinstance(pool, nn.MaxPool2d)
        and not pool.return_indices
        and all(pair(getattr(pool, k)) == pair(v) for k, v in want.items())
    )
    if not ok:
        raise ValueError(
            f"model.stem_pool parity: {type(model).__name__} has no stem max pool of kernel 3, stride 2, padding 1 "
            f"(found {pool!r}); it applies to torchvision ResNets and ResNeXts, use model.stem_pool aten otherwise"
        )
    model.maxpool = ParityMaxPool2d()
    return model
