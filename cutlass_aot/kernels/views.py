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
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


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


@dsl_user_op
def _tanh_pair(x0, x1, *, loc=None, ip=None):
    """tanh of two fp32 values in one MUFU op: ``tanh.approx.f16x2``.

    The pair is packed to f16x2 (round to nearest; beyond f16's range it
    becomes +-inf, whose tanh is exactly +-1), and the results are widened
    back to fp32. The f16 input costs at most 0.45 * 2^-11 of tanh's value
    (tanh' * u peaks at 0.45), the op's own error is about 2^-11, the same as
    ``tanh.approx.f32``'s: below a bf16 output's rounding, about one f16 ulp.
    """
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32()]),
        [cutlass.Float32(x0).ir_value(loc=loc, ip=ip), cutlass.Float32(x1).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 p;\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.f16x2.f32 p, $3, $2;\n\t"
        "tanh.approx.f16x2 p, p;\n\t"
        "mov.b32 {lo, hi}, p;\n\t"
        "cvt.f32.f16 $0, lo;\n\t"
        "cvt.f32.f16 $1, hi;\n\t}",
        "=f,=f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    return (cutlass.Float32(llvm.extractvalue(T.f32(), res, [0], loc=loc, ip=ip)),
            cutlass.Float32(llvm.extractvalue(T.f32(), res, [1], loc=loc, ip=ip)))


def activate_fragment(frag, count: int, act: str | None) -> None:
    """The epilogue activation ``act`` on ``frag[0:count]`` (fp32), in place.

    GELU goes two values at a time: its tanh, the one MUFU op of each value,
    is the epilogue's bottleneck (16 results a clock per SM; a 128x256 tile
    runs 32768 between its mainloops, about 3% of a tile's time at K = 4096),
    and the packed ``tanh.approx.f16x2`` (``_tanh_pair``) halves it. The FP32
    arithmetic around it is ``activate``'s. Every other activation is
    ``activate`` per value. ``count`` is a fragment's static size; an odd one
    leaves its last value to ``activate``. A trace-time helper: its loops are
    Python's, unrolled as the kernel is traced.
    """
    if cutlass.const_expr(act == "gelu"):
        for i in range(0, count - 1, 2):
            v0, v1 = frag[i], frag[i + 1]
            h0, h1 = cutlass.Float32(0.5) * v0, cutlass.Float32(0.5) * v1
            u0 = v0 * (cutlass.Float32(0.035677408136300125) * (v0 * v0)
                       + cutlass.Float32(0.7978845608028654))
            u1 = v1 * (cutlass.Float32(0.035677408136300125) * (v1 * v1)
                       + cutlass.Float32(0.7978845608028654))
            t0, t1 = _tanh_pair(u0, u1)
            frag[i] = h0 * t0 + h0
            frag[i + 1] = h1 * t1 + h1
        if cutlass.const_expr(count % 2 == 1):
            frag[count - 1] = activate(frag[count - 1], act)
    elif cutlass.const_expr(act is not None and act != "none"):
        for i in range(count):
            frag[i] = activate(frag[i], act)


__all__ = ["activate", "activate_fragment", "swap_mn", "to_mkl", "to_nkl"]
