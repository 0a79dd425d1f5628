"""Ops: ``torch.ops.cutlass_aot.gemm``, a torch.library custom op over the cache.

Run side: imports torch and the run side only. Importing this module
registers the op (once per process; ``register()`` is idempotent), which is
what ``import cutlass_aot.nn`` and ``cutlass_aot.ops`` do.

Schema::

    cutlass_aot::gemm(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None,
                      str act="none", float alpha=1., float beta=1.,
                      ScalarType? out_dtype=None, str? cache=None,
                      str? on_miss=None) -> Tensor

It is functional, as custom ops must be: it returns a new tensor
``act(alpha * a @ b + beta * c + bias)`` of shape ``[M,N]`` or ``[L,M,N]``,
row-major, of dtype ``out_dtype``, else ``c``'s dtype, else ``a``'s.
``cache`` is a cache directory (None: the default cache) and ``on_miss``
its policy (None: $CUTLASS_AOT_ON_MISS), the two arguments of
``open_cache``; strings, so that a compiled graph holds them as constants.

* The fake (meta) implementation checks ranks, shapes and the epilogue
  arguments and returns an empty tensor of the right shape, dtype and
  device, so torch.compile(fullgraph=True) traces models that call the op
  with no graph break, and CUDA graphs (mode="reduce-overhead") capture it.
* The real implementation allocates the output and calls the cache's
  ``gemm`` with ``out=``. Compared with ``cutlass_aot.gemm`` it pays the
  dispatcher's per-call cost in eager mode (benchmarks/bench_host.py
  measures both); under torch.compile and CUDA graphs that cost is gone.
* No autograd formula (its Python wrapper would cost more per call than the
  GEMM launch): a call that autograd would have to differentiate raises
  ArgumentError. ``cutlass_aot.nn.Linear`` runs ``F.linear`` in that case,
  so a patched model still trains, with torch's kernels.
"""

from __future__ import annotations

import threading

import torch

from ..errors import ArgumentError
from .fallback import ACTIVATIONS, check_act, check_bias

OP_NAME = "cutlass_aot::gemm"
# Written out rather than inferred from annotations, so every torch version
# registers the same schema.
SCHEMA = ("(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None, str act=\"none\", float alpha=1., "
          "float beta=1., ScalarType? out_dtype=None, str? cache=None, str? on_miss=None) -> Tensor")

_OP = None
_LIB = None
_REGISTER_LOCK = threading.Lock()
# (cache path or None, on_miss or None) -> that cache's gemm entry point.
_RUNNERS: dict[tuple, object] = {}


def _runner(cache: str | None, on_miss: str | None):
    fn = _RUNNERS.get((cache, on_miss))
    if fn is None:
        from .load import open_cache  # noqa: PLC0415 - first call per (cache, policy) only

        fn = _RUNNERS[(cache, on_miss)] = open_cache(cache, on_miss=on_miss).gemm
    return fn


def output_meta(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, bias: torch.Tensor | None,
                act: str, out_dtype: torch.dtype | None) -> tuple[tuple, torch.dtype]:
    """(shape, dtype) of the op's output; ArgumentError for arguments that cannot agree.

    Shared by the fake and the real implementation, so both refuse the same
    calls with the same message.
    """
    if a.dim() not in (2, 3) or b.dim() != a.dim():
        raise ArgumentError(
            f"cutlass_aot::gemm takes a[M,K] @ b[K,N] or a[L,M,K] @ b[L,K,N]; got a of shape "
            f"{tuple(a.shape)} and b of shape {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ArgumentError(f"cutlass_aot::gemm shapes do not agree: a{tuple(a.shape)} @ b{tuple(b.shape)}")
    shape = (*a.shape[:-1], b.shape[-1])
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else a.dtype)
    if c is not None and (tuple(c.shape) != shape or c.dtype != dtype):
        raise ArgumentError(
            f"cutlass_aot::gemm: c must have the output's shape {shape} and dtype {dtype}; got "
            f"{tuple(c.shape)}, {c.dtype}", tensor="c")
    check_act(act)
    check_bias(bias, shape[-1], dtype, a.device)
    return shape, dtype


def _gemm_impl(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, act: str = "none", alpha: float = 1.0,
               beta: float = 1.0, out_dtype: torch.dtype | None = None, cache: str | None = None,
               on_miss: str | None = None) -> torch.Tensor:
    shape, dtype = output_meta(a, b, c, bias, act, out_dtype)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad
                                    or (c is not None and c.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        raise ArgumentError(
            "cutlass_aot::gemm has no backward: call it under torch.no_grad() or "
            "torch.inference_mode(), or detach the inputs (cutlass_aot.nn.Linear runs "
            "F.linear itself when autograd needs its gradients)", reason="autograd")
    out = torch.empty(shape, dtype=dtype, device=a.device)
    _runner(cache, on_miss)(a, b, out, c=c, bias=bias, act=None if act == "none" else act,
                            alpha=alpha, beta=beta)
    return out


# The op's implementation, for eager callers that need no tracing
# (cutlass_aot.nn.Linear outside torch.compile): the same checks and result
# as ``torch.ops.cutlass_aot.gemm``, without the dispatcher's per-call cost.
gemm_eager = _gemm_impl


def _gemm_fake(a, b, c=None, bias=None, act="none", alpha=1.0, beta=1.0, out_dtype=None, cache=None,
               on_miss=None):
    shape, dtype = output_meta(a, b, c, bias, act, out_dtype)
    return a.new_empty(shape, dtype=dtype)


def _stride_tags() -> tuple:
    """Ask Inductor to pass the inputs with the strides they had when traced.

    The artifact a call needs depends on its operands' strides (``w.t()`` is
    b_major "k"); a compiler free to relayout them could turn a served call
    into a miss. ``needs_exact_strides`` is the newer, stricter tag.
    """
    for name in ("needs_exact_strides", "needs_fixed_stride_order"):
        tag = getattr(torch.Tag, name, None)
        if tag is not None:
            return (tag,)
    return ()


def register():
    """Register ``torch.ops.cutlass_aot.gemm`` (once per process) and return it.

    Through ``torch.library.Library`` rather than ``torch.library.custom_op``:
    one kernel for every backend (CompositeExplicitAutograd) and a fake
    implementation, and no Python autograd wrapper, which keeps the eager
    dispatch cost several times lower (measured: ``custom_op`` with an
    autograd formula costs 6-12x a plain Library kernel per call).
    """
    global _OP, _LIB
    if _OP is not None:
        return _OP
    with _REGISTER_LOCK:
        if _OP is None:
            lib = torch.library.Library("cutlass_aot", "FRAGMENT")
            lib.define("gemm" + SCHEMA, tags=(torch.Tag.pt2_compliant_tag, *_stride_tags()))
            lib.impl("gemm", _gemm_impl, "CompositeExplicitAutograd")
            torch.library.register_fake(OP_NAME, _gemm_fake, lib=lib)
            _LIB = lib  # registrations live as long as this object
            _OP = torch.ops.cutlass_aot.gemm
    return _OP


gemm = register()

__all__ = ["ACTIVATIONS", "OP_NAME", "gemm", "gemm_eager", "output_meta", "register"]
