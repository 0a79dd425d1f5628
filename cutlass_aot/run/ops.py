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
* Autograd: a backward in torch (the product's gradients by matmul, the
  activation's by autograd on the recomputed pre-activation), so a patched
  model can still be fine-tuned; the forward is the fast part.
"""

from __future__ import annotations

import threading

import torch

from .fallback import ACTIVATIONS, apply_act, check_act, check_bias

OP_NAME = "cutlass_aot::gemm"
# Written out rather than inferred from annotations, so every torch version
# registers the same schema.
SCHEMA = ("(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None, str act=\"none\", float alpha=1., "
          "float beta=1., ScalarType? out_dtype=None, str? cache=None, str? on_miss=None) -> Tensor")

_OP = None
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
    from ..errors import ArgumentError  # noqa: PLC0415 - keeps this module's import list short

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
    out = torch.empty(shape, dtype=dtype, device=a.device)
    _runner(cache, on_miss)(a, b, out, c=c, bias=bias, act=None if act == "none" else act,
                            alpha=alpha, beta=beta)
    return out


def _gemm_fake(a, b, c=None, bias=None, act="none", alpha=1.0, beta=1.0, out_dtype=None, cache=None,
               on_miss=None):
    shape, dtype = output_meta(a, b, c, bias, act, out_dtype)
    return a.new_empty(shape, dtype=dtype)


def _setup_context(ctx, inputs, output) -> None:
    a, b, c, bias, act, alpha, beta = inputs[:7]
    ctx.act, ctx.alpha, ctx.beta = act, alpha, beta
    ctx.has_c, ctx.has_bias = c is not None, bias is not None
    ctx.save_for_backward(a, b, c, bias)


def _backward(ctx, grad):
    a, b, c, bias = ctx.saved_tensors
    g = grad.float()
    if ctx.act != "none":
        # Gradient of the activation at the recomputed pre-activation.
        with torch.enable_grad():
            z = torch.matmul(a, b).float() * ctx.alpha
            if c is not None:
                z = z + c.float() * ctx.beta
            if bias is not None:
                z = z + bias.float()
            z = z.detach().requires_grad_()
            (g,) = torch.autograd.grad(apply_act(z, ctx.act), z, g)
    need = ctx.needs_input_grad
    grad_a = grad_b = grad_c = grad_bias = None
    if need[0]:
        grad_a = (torch.matmul(g.to(b.dtype), b.transpose(-1, -2)) * ctx.alpha).to(a.dtype)
    if need[1]:
        grad_b = (torch.matmul(a.transpose(-1, -2), g.to(a.dtype)) * ctx.alpha).to(b.dtype)
    if need[2] and c is not None:
        grad_c = (g * ctx.beta).to(c.dtype)
    if need[3] and bias is not None:
        grad_bias = g.reshape(-1, g.shape[-1]).sum(0).to(bias.dtype)
    return grad_a, grad_b, grad_c, grad_bias, None, None, None, None, None, None


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
    """Register ``torch.ops.cutlass_aot.gemm`` (once per process) and return it."""
    global _OP
    if _OP is not None:
        return _OP
    with _REGISTER_LOCK:
        if _OP is None:
            op = torch.library.custom_op(OP_NAME, _gemm_impl, mutates_args=(), schema=SCHEMA,
                                         tags=_stride_tags())
            op.register_fake(_gemm_fake)
            op.register_autograd(_backward, setup_context=_setup_context)
            _OP = torch.ops.cutlass_aot.gemm
    return _OP


gemm = register()

__all__ = ["ACTIVATIONS", "OP_NAME", "gemm", "output_meta", "register"]
