"""Trace-time pieces shared by the kernel programs: tensor views and the activations.

Owns the re-indexing of the caller's tensors (a[M,K] or a[L,M,K], b[K,N] or
b[L,K,N], d[M,N] or d[L,M,N], in their natural PyTorch shapes) into CuTe's
(M,K,L) / (N,K,L) / (M,N,L) views, and the epilogue activations on one fp32
value. Everything here runs while a kernel is traced, so it is baked into
each artifact: every family that uses it lists this file among its
``source_files``. Build side only: imports the CuTe DSL and must never be
imported by the run side.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


def _leading(t: cute.Tensor):
    """The non-unit stride of a 2-D tensor.

    Used as the (never stepped) batch stride of a rank-2 call: it is known to
    be 16-byte divisible, which the TMA descriptor requires of every stride.
    """
    return t.stride[1] if isinstance(t.stride[0], int) and t.stride[0] == 1 else t.stride[0]


def _view(t: cute.Tensor, rank: int, first: int, second: int, zero_batch_stride: bool) -> cute.Tensor:
    """(dim ``first``, dim ``second``, L) of a rank-2 (dims 0, 1) or rank-3 (L, 1, 2) tensor.

    A rank-2 call's batch stride is never stepped: 0, or (for TMA, which
    checks every stride's alignment) the tensor's leading stride.
    """
    if rank == 2:
        batch = 0 if zero_batch_stride else _leading(t)
        layout = cute.make_layout(
            (t.shape[first], t.shape[second], 1), stride=(t.stride[first], t.stride[second], batch)
        )
    else:
        layout = cute.make_layout(
            (t.shape[first + 1], t.shape[second + 1], t.shape[0]),
            stride=(t.stride[first + 1], t.stride[second + 1], t.stride[0]),
        )
    return cute.make_tensor(t.iterator, layout)


def to_mkl(t: cute.Tensor, rank: int, zero_batch_stride: bool = False) -> cute.Tensor:
    """View a[M,K] / a[L,M,K] (or d[M,N] / d[L,M,N]) as (M, K, L)."""
    return _view(t, rank, 0, 1, zero_batch_stride)


def to_nkl(t: cute.Tensor, rank: int, zero_batch_stride: bool = False) -> cute.Tensor:
    """View b[K,N] / b[L,K,N] as (N, K, L)."""
    return _view(t, rank, 1, 0, zero_batch_stride)


def swap_mn(t: cute.Tensor) -> cute.Tensor:
    """The (N, M, L) view of an (M, N, L) tensor (swap-AB's transposed D and C)."""
    layout = cute.make_layout(
        (t.shape[1], t.shape[0], t.shape[2]), stride=(t.stride[1], t.stride[0], t.stride[2])
    )
    return cute.make_tensor(t.iterator, layout)


def activate(v, act: str | None):
    """The epilogue activation ``act`` (None, relu, silu, gelu, gelu_erf) of one fp32 value."""
    if cutlass.const_expr(act == "relu"):
        v = cute.math.max(v, cutlass.Float32(0.0))
    elif cutlass.const_expr(act == "silu"):
        v = v / (cutlass.Float32(1.0) + cute.math.exp(-v, fastmath=True))
    elif cutlass.const_expr(act == "gelu"):
        # tanh.approx.f32 (one MUFU op; abs. error about 2^-11, below a
        # bf16/f16 output's rounding), as CUTLASS C++'s GELU_taylor does.
        # 0.5 v (1 + tanh(u)) with u = sqrt(2/pi) (v + 0.044715 v^3), written
        # as u = v (c0 + c1 v^2) and h tanh(u) + h with h = v/2: two FMAs and
        # three multiplies around the tanh, where the textbook order compiles
        # to seven FP32 instructions (r43). A 128x256 tile runs 32768 of these
        # between its mainloops, so the epilogue's FP32 work drops by 2/7.
        half = cutlass.Float32(0.5) * v
        inner = v * (cutlass.Float32(0.035677408136300125) * (v * v)
                     + cutlass.Float32(0.7978845608028654))
        v = half * cute.math.tanh(inner, approx=True) + half
    elif cutlass.const_expr(act == "gelu_erf"):
        v = cutlass.Float32(0.5) * v * (
            cutlass.Float32(1.0) + cute.math.erf(v * cutlass.Float32(0.7071067811865476)))
    return v


__all__ = ["activate", "swap_mn", "to_mkl", "to_nkl"]
