"""Ops: ``torch.ops.cutlass_aot.gemm``, a torch.library custom op over the cache.

Run side: imports torch and the run side only. Importing this module
registers the op (once per process; ``register()`` is idempotent), which is
what ``import cutlass_aot.nn`` and ``cutlass_aot.ops`` do.

Schema::

    cutlass_aot::gemm(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None,
                      str act="none", float alpha=1., float beta=1.,
                      ScalarType? out_dtype=None, str? cache=None,
                      str? on_miss=None) -> Tensor

    cutlass_aot::gemm_out(Tensor a, Tensor b, Tensor(a!) out, Tensor? c=None,
                          Tensor? bias=None, str act="none", float alpha=1.,
                          float beta=1., str? cache=None, str? on_miss=None) -> ()

``gemm`` is functional: it returns a new tensor
``act(alpha * a @ b + beta * c + bias)`` of shape ``[M,N]`` or ``[L,M,N]``,
row-major, of dtype ``out_dtype``, else ``c``'s dtype, else ``a``'s.
``cache`` is a cache directory (None: the default cache) and ``on_miss``
its policy (None: $CUTLASS_AOT_ON_MISS), the two arguments of
``open_cache``; strings, so that a compiled graph holds them as constants.
``gemm_out`` writes the same result into ``out`` (its dtype plays
``out_dtype``; shape and device must be the output's): the form for callers
that let the compiler own the buffer. Under torch.compile, Inductor
re-inplaces it (no copy) and allocates ``out`` as one of its planned
buffers, which it reuses across calls in a graph, where ``gemm``'s output
is a fresh allocation per call (cutlass_aot.nn.Linear uses ``gemm_out``
when compiled).

* The fake (meta) implementation checks ranks, shapes and the epilogue
  arguments and returns an empty tensor of the right shape, dtype and
  device, so torch.compile(fullgraph=True) traces models that call the op
  with no graph break, and CUDA graphs (mode="reduce-overhead") capture it.
* The real implementation allocates the output and calls the cache's
  ``gemm`` with ``out=``. Its checks run in full once per call key (the
  operands' shapes, dtypes and devices, the epilogue arguments: ``_PLANS``,
  memoized as dispatch.py memoizes its choices); a call seen before costs a
  key, a dict lookup, the grad-mode guard, one ``new_empty_strided`` and the
  cache's gemm entry. A bad call is never memoized, so it raises on every
  call. Compared with ``cutlass_aot.gemm`` it pays the torch dispatcher's
  per-call cost in eager mode (benchmarks/bench_host.py measures both, and
  the op's host pieces alone with ``--cpu``); under CUDA graphs that cost is
  gone, while a torch.compile graph without them still calls the op through
  the dispatcher.
* No autograd formula (its Python wrapper would cost more per call than the
  GEMM launch): a call that autograd would have to differentiate raises
  ArgumentError. ``cutlass_aot.nn.Linear`` runs ``F.linear`` in that case,
  so a patched model still trains, with torch's kernels.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch.autograd import forward_ad as _forward_ad

from ..errors import ArgumentError
from .fallback import ACTIVATIONS, check_act, check_bias

OP_NAME = "cutlass_aot::gemm"
# Written out rather than inferred from annotations, so every torch version
# registers the same schema.
SCHEMA = ("(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None, str act=\"none\", float alpha=1., "
          "float beta=1., ScalarType? out_dtype=None, str? cache=None, str? on_miss=None) -> Tensor")
OUT_OP_NAME = "cutlass_aot::gemm_out"
OUT_SCHEMA = ("(Tensor a, Tensor b, Tensor(a!) out, Tensor? c=None, Tensor? bias=None, "
              "str act=\"none\", float alpha=1., float beta=1., str? cache=None, "
              "str? on_miss=None) -> ()")

_OP = None
_OUT_OP = None
_LIB = None
_REGISTER_LOCK = threading.Lock()
# (cache path or None, on_miss or None) -> that cache's gemm entry point.
_RUNNERS: dict[tuple, object] = {}
_grad_enabled, _empty_strided = torch.is_grad_enabled, torch.empty_strided
_INPUT_DTYPES = (torch.float16, torch.bfloat16)


def forward_ad_active() -> bool:
    """Whether a forward-mode AD level is open (fwAD.dual_level, torch.func.jvp):
    the op has no forward-AD formula, and a tangent through it would come back
    zero, not refused."""
    return _forward_ad._current_level >= 0


def check_autograd(name: str, *tensors) -> None:
    """ArgumentError if autograd would have to differentiate this call.

    Both implementations run it: the real one in eager calls, the fake one
    while torch.compile traces (AOTAutograd traces the fake; without this
    check a compiled graph's backward would silently give no gradients)."""
    if _grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ArgumentError(
            f"{name} has no backward: call it under torch.no_grad() or torch.inference_mode(), or "
            "detach the inputs (cutlass_aot.nn.Linear runs F.linear itself when autograd needs "
            "its gradients)", reason="autograd")
    if forward_ad_active():
        raise ArgumentError(
            f"{name} has no forward-mode AD formula, and a forward-AD level is open (fwAD.dual_level, "
            "torch.func.jvp): compute this product with torch there (cutlass_aot.nn.Linear does)",
            reason="autograd")


def _runner(cache: str | None, on_miss: str | None):
    fn = _RUNNERS.get((cache, on_miss))
    if fn is None:
        from .load import open_cache  # noqa: PLC0415 - first call per (cache, policy) only

        fn = _RUNNERS[(cache, on_miss)] = open_cache(cache, on_miss=on_miss).gemm
    return fn


def bind_cache(cache) -> str:
    """Make ``cache`` (a Cache object) the one the op's calls with its path and
    policy go through; returns the path string to pass as ``cache=``. The last
    Cache bound for a (path, policy) serves it (nn.Linear and patch bind the
    one they are given, so its stats and settings are the model's)."""
    path = str(cache.path)
    _RUNNERS[(path, cache.on_miss)] = cache.gemm
    return path


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
    if a.dtype not in _INPUT_DTYPES or b.dtype != a.dtype:
        # What every kernel takes (wgmma and mma.sync have one 16-bit input
        # type), and what torch.matmul takes: one dtype for both.
        raise ArgumentError(
            f"cutlass_aot::gemm takes a and b of one dtype, float16 or bfloat16; got {a.dtype} and "
            f"{b.dtype}: convert them (x.to(torch.bfloat16))", reason="dtype")
    shape = (*a.shape[:-1], b.shape[-1])
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else a.dtype)
    if c is not None and (tuple(c.shape) != shape or c.dtype != dtype):
        raise ArgumentError(
            f"cutlass_aot::gemm: c must have the output's shape {shape} and dtype {dtype}; got "
            f"{tuple(c.shape)}, {c.dtype}", tensor="c")
    check_act(act)
    check_bias(bias, shape[-1], dtype, a.device)
    return shape, dtype


# Per-call plans, memoized like the dispatcher's choices (dispatch.py's memo):
# key -> (out shape, out strides, out dtype, device, out dtype is a's).
# The key holds every value output_meta's checks read (ranks and shapes of
# a and b; a's and b's dtypes; a's device; out_dtype; act and its type; c's type,
# shape and dtype; bias's type, shape, dtype and device), and a plan is
# stored only after those checks passed, so a key that is in the memo names
# a valid call, and any other call is checked in full. Strides are not in
# the key: the output's meta does not depend on them (the dispatcher keys
# its own memo on them).
_PLANS: dict[tuple, tuple] = {}
_PLAN_LIMIT = 4096


def _new_plan(key, a, b, c, bias, act, out_dtype) -> tuple:
    """Check a call in full (ArgumentError if bad: never memoized) and memoize its plan."""
    shape, dtype = output_meta(a, b, c, bias, act, out_dtype)
    # The row-major strides torch gives this shape (zero-sized dims included).
    strides = torch.empty(shape, dtype=dtype, device="meta").stride()
    plan = (shape, strides, dtype, a.device, dtype == a.dtype)
    if key is not None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def call_plan(a, b, c, bias, act, out_dtype) -> tuple:
    """(shape, strides, dtype, device, dtype is a's) of a call's output, checked.

    The first step of ``_gemm_impl``'s every call: a memo hit for a key seen
    before, else the full checks of ``output_meta`` (ArgumentError for a bad
    call, which is never memoized).
    """
    try:
        key = (a.shape, b.shape, a.dtype, b.dtype, a.device, out_dtype, act, type(act),
               None if c is None else (type(c), c.shape, c.dtype),
               None if bias is None else (type(bias), bias.shape, bias.dtype, bias.device))
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors, an unhashable act: the checks say what
        key = plan = None
    return plan if plan is not None else _new_plan(key, a, b, c, bias, act, out_dtype)


def _gemm_impl(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, act: str = "none", alpha: float = 1.0,
               beta: float = 1.0, out_dtype: torch.dtype | None = None, cache: str | None = None,
               on_miss: str | None = None) -> torch.Tensor:
    # The hot path (an eager nn.Linear and every compiled graph's call): for a
    # call key seen before, one key and one dict lookup instead of the checks.
    shape, strides, dtype, device, like_a = call_plan(a, b, c, bias, act, out_dtype)
    if (_grad_enabled() and (a.requires_grad or b.requires_grad
                             or (c is not None and c.requires_grad)
                             or (bias is not None and bias.requires_grad))) or forward_ad_active():
        check_autograd(OP_NAME, a, b, c, bias)
    # The cheapest allocations torch has (benchmarks/bench_host.py times them):
    # new_empty_strided takes dtype and device from a; empty_strided parses
    # fewer overloads than empty.
    out = a.new_empty_strided(shape, strides) if like_a else \
        _empty_strided(shape, strides, dtype=dtype, device=device)
    run = _RUNNERS.get((cache, on_miss))
    if run is None:
        run = _runner(cache, on_miss)
    run(a, b, out, c=c, bias=bias, act=None if act == "none" else act, alpha=alpha, beta=beta)
    return out


# The op's implementation, for eager callers that need no tracing
# (cutlass_aot.nn.Linear outside torch.compile): the same checks and result
# as ``torch.ops.cutlass_aot.gemm``, without the dispatcher's per-call cost.
gemm_eager = _gemm_impl


def one_device(**tensors) -> None:
    """ArgumentError unless every given tensor is on one device.

    The fake implementations' half of the dispatcher's device check (which
    the real calls reach): a traced graph that mixes devices fails when it is
    traced, not on its first run.
    """
    devs = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devs.values())) > 1:
        raise ArgumentError("cutlass_aot::gemm operands must be on one device; got "
                            + ", ".join(f"{n}={d}" for n, d in devs.items()),
                            devices={n: str(d) for n, d in devs.items()})


def _gemm_fake(a, b, c=None, bias=None, act="none", alpha=1.0, beta=1.0, out_dtype=None, cache=None,
               on_miss=None):
    shape, dtype = output_meta(a, b, c, bias, act, out_dtype)
    one_device(a=a, b=b, c=c, bias=bias)
    check_autograd(OP_NAME, a, b, c, bias)
    return a.new_empty(shape, dtype=dtype)


def check_out(out: torch.Tensor, shape: tuple, device: torch.device) -> None:
    """``gemm_out``'s out: a tensor of the output's shape on a's device (its
    dtype is the output's dtype; the cache's gemm checks its strides)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape) or out.device != device:
        got = (f"{tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor)
               else type(out).__name__)
        raise ArgumentError(f"cutlass_aot::gemm_out: out must have the output's shape {tuple(shape)} "
                            f"on {device}; got {got}", tensor="out")


def _gemm_out_impl(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, act: str = "none", alpha: float = 1.0,
                   beta: float = 1.0, cache: str | None = None, on_miss: str | None = None) -> None:
    # out's dtype plays out_dtype: the same checks and memo as the functional op.
    shape, _, _, device, _ = call_plan(a, b, c, bias, act, out.dtype)
    if out.shape != shape or out.device != device:
        check_out(out, shape, device)
    if (_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad
                             or (c is not None and c.requires_grad)
                             or (bias is not None and bias.requires_grad))) or forward_ad_active():
        check_autograd(OUT_OP_NAME, a, b, out, c, bias)
    run = _RUNNERS.get((cache, on_miss))
    if run is None:
        run = _runner(cache, on_miss)
    run(a, b, out, c=c, bias=bias, act=None if act == "none" else act, alpha=alpha, beta=beta)


def _gemm_out_fake(a, b, out, c=None, bias=None, act="none", alpha=1.0, beta=1.0, cache=None,
                   on_miss=None) -> None:
    shape, _ = output_meta(a, b, c, bias, act, out.dtype)
    check_out(out, shape, a.device)
    one_device(a=a, b=b, c=c, bias=bias)
    check_autograd(OUT_OP_NAME, a, b, out, c, bias)


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


def _registered_elsewhere() -> bool:
    """Whether this process already defines cutlass_aot::gemm (not through this module)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, "CompositeExplicitAutograd")
    except RuntimeError:
        return False


def register():
    """Register ``torch.ops.cutlass_aot.gemm`` and ``gemm_out`` (once per process); return ``gemm``.

    Through ``torch.library.Library`` rather than ``torch.library.custom_op``:
    one kernel for every backend (CompositeExplicitAutograd) and a fake
    implementation, and no Python autograd wrapper, which keeps the eager
    dispatch cost several times lower (measured: ``custom_op`` with an
    autograd formula costs 6-12x a plain Library kernel per call).
    """
    global _OP, _OUT_OP, _LIB
    if _OP is not None:
        return _OP
    with _REGISTER_LOCK:
        if _OP is None and _registered_elsewhere():
            # Another copy of this module (a re-import after sys.modules was
            # purged, a vendored copy) registered the ops in this process;
            # torch refuses a second definition. Its kernels serve the calls.
            warnings.warn("cutlass-aot: torch.ops.cutlass_aot.gemm was registered by another copy of "
                          "cutlass_aot in this process; its implementation serves the op (import one "
                          "copy per process)", RuntimeWarning, stacklevel=2)
            _OUT_OP = torch.ops.cutlass_aot.gemm_out
            _OP = torch.ops.cutlass_aot.gemm
        if _OP is None:
            lib = torch.library.Library("cutlass_aot", "FRAGMENT")
            lib.define("gemm" + SCHEMA, tags=(torch.Tag.pt2_compliant_tag, *_stride_tags()))
            lib.impl("gemm", _gemm_impl, "CompositeExplicitAutograd")
            torch.library.register_fake(OP_NAME, _gemm_fake, lib=lib)
            lib.define("gemm_out" + OUT_SCHEMA, tags=(torch.Tag.pt2_compliant_tag, *_stride_tags()))
            lib.impl("gemm_out", _gemm_out_impl, "CompositeExplicitAutograd")
            torch.library.register_fake(OUT_OP_NAME, _gemm_out_fake, lib=lib)
            _LIB = lib  # registrations live as long as this object
            _OUT_OP = torch.ops.cutlass_aot.gemm_out
            _OP = torch.ops.cutlass_aot.gemm
    return _OP


gemm = register()
gemm_out = _OUT_OP

__all__ = ["ACTIVATIONS", "OP_NAME", "OUT_OP_NAME", "bind_cache", "call_plan", "check_out", "gemm", "gemm_eager",
           "gemm_out", "output_meta", "register"]
