"""Fallback: the pure-torch reference of a cutlass-aot GEMM call.

Run side: imports torch and the core modules only.

``torch_gemm`` computes what an artifact would, with torch:

    D = act(alpha * (A @ B) + beta * C + bias)

* ``A @ B`` is ``torch.matmul`` in the inputs' dtype (fp32 accumulation
  inside torch's GEMM, one rounding to the input dtype at the end);
* the epilogue (alpha, beta * C, bias, act) runs in fp32, and the result is
  rounded once to D's dtype. The kernels keep the product in fp32 up to the
  epilogue, so the two differ by that one extra rounding of the product:
  within 2^-8 relative for bf16 and 2^-11 for f16, per element.
* ``bias`` is a vector of length N (D's dtype or fp32), broadcast over M and L.
* ``act`` is one of ACTIVATIONS: ``gelu`` is the tanh approximation
  (``F.gelu(x, approximate="tanh")``), ``gelu_erf`` the exact one.

It is what ``on_miss="torch"`` runs for a call no artifact serves (after the
call's arguments were validated: a fallback covers coverage gaps, never bad
arguments), and the reference the GPU tests compare against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ArgumentError
from ..signature import GEMM_ACTS

ACTIVATIONS = GEMM_ACTS


def check_act(act: str | None) -> str:
    """The canonical activation name ("none" for None); ArgumentError if unknown."""
    if act is None:
        return "none"
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ArgumentError(
            f"gemm: unknown act {act!r}; use one of {', '.join(ACTIVATIONS)} (or None)",
            reason="act")
    return act


def check_bias(bias, n: int, out_dtype: torch.dtype, device: torch.device) -> None:
    """A per-column bias: 1-D, length N, D's dtype or fp32, on D's device."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise ArgumentError(f"gemm: bias must be a torch.Tensor or None, got {type(bias).__name__}",
                            tensor="bias")
    if bias.dim() != 1 or bias.shape[0] != n:
        raise ArgumentError(
            f"gemm: bias must be a vector of length N={n} (one value per output column); "
            f"got shape {tuple(bias.shape)}", tensor="bias", reason="shape")
    if bias.dtype not in (out_dtype, torch.float32):
        raise ArgumentError(
            f"gemm: bias has dtype {bias.dtype}; use out's dtype ({out_dtype}) or torch.float32",
            tensor="bias", reason="dtype")
    if bias.device != device:
        raise ArgumentError(
            f"gemm: bias is on {bias.device}, the output on {device}; move it with .to({str(device)!r})",
            tensor="bias", reason="device", devices={"bias": str(bias.device), "out": str(device)})


def apply_act(x: torch.Tensor, act: str) -> torch.Tensor:
    """The activation by name (see ACTIVATIONS)."""
    if act == "none":
        return x
    if act == "relu":
        return torch.relu(x)
    if act == "gelu":
        return F.gelu(x, approximate="tanh")
    if act == "gelu_erf":
        return F.gelu(x)
    if act == "silu":
        return F.silu(x)
    raise ArgumentError(f"gemm: unknown act {act!r}; use one of {', '.join(ACTIVATIONS)}", reason="act")


def _fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 accumulation and an fp32 result: on a GPU, cuBLAS's
    16-bit GEMM with an fp32 output (``out_dtype``, tensor cores) where torch
    has it; else the inputs widened to fp32 (exact products, slower)."""
    if a.is_cuda and a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16):
        try:
            return (torch.mm if a.dim() == 2 else torch.bmm)(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # a torch without out_dtype for these
            pass
    return torch.matmul(a.float(), b.float())


def torch_gemm(a, b, out=None, c=None, bias=None, act=None, alpha=1.0, beta=1.0):
    """D = act(alpha * a @ b + beta * c + bias) with torch; written into ``out`` and returned.

    Same arguments and shapes as ``cache.gemm``: a[M,K] @ b[K,N] or
    a[L,M,K] @ b[L,K,N]; ``out`` defaults to a new tensor of a's dtype;
    without ``c``, or with ``beta`` = 0, ``c`` is not read (BLAS).

    Like the kernels, the product stays in fp32 until the epilogue, for f16
    and bf16 alike: an f16 product past 65504 is not rounded to inf, nor a
    bf16 product to 8 bits, before alpha, C, the bias or an fp32 ``out``
    (a residual that cancels it, an fp32 output) would see it. Only a plain
    call into a's dtype multiplies in that dtype (the rounding is then the
    output's own). A and B of two dtypes multiply in fp32.
    """
    act = check_act(act)
    if c is not None and not beta:
        c = None
    plain = c is None and bias is None and act == "none" and alpha == 1.0
    wide = a.dtype != b.dtype or not (plain and (out is None or out.dtype == a.dtype))
    prod = _fp32_product(a, b) if wide else torch.matmul(a, b)
    if out is None:
        if plain:
            return prod
        out = torch.empty(prod.shape, dtype=a.dtype, device=a.device)
    check_bias(bias, prod.shape[-1], out.dtype, out.device)
    if plain and prod.dtype == out.dtype:
        out.copy_(prod)
        return out
    acc = prod.float()
    if alpha != 1.0:
        acc = acc * alpha
    if c is not None:
        acc = acc + c.float() * beta
    if bias is not None:
        acc = acc + bias.float()
    out.copy_(apply_act(acc, act))
    return out
