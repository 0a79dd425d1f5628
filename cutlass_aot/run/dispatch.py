"""Dispatch: map torch tensors to a precompiled GEMM and launch it.

Run side: imports the standard library, torch and the core modules only.

Three binding tiers:

* Fixed at build time (baked into each artifact): dtypes of A, B, D (and
  C), which dim of each operand is contiguous, rank (2-D or batched 3-D),
  16-byte alignment, tile and cluster shape, raster order, target arch.
* Fixed at first use, per process: the cache index (read once at open); per
  *route* (dtypes, contiguity, rank, devices, whether C is given) the
  signature, the candidate variants, the device's arch and SM count; per
  problem shape, the chosen variant (memoized, bounded) and its artifact,
  verified by sha256 and dlopened on first selection.
* At each call: two method calls per tensor (``stride()``, ``get_device()``),
  one dict lookup for the route, one for the shape's choice, and the
  artifact call. The artifact's compiled checks (dtypes, ranks, equal M/N/K/L
  across operands, stride divisibility, pointer alignment) run before its
  launch; if they refuse, the failure is diagnosed here and re-raised as an
  ArgumentError naming the tensor and the fix. The kernel runs on torch's
  current stream (TVM-FFI's environment stream), so side streams and CUDA
  graph capture work unchanged.

Choice among variants of one signature (a documented heuristic; no tuned
table yet): estimate each candidate's time as waves x tile work / tile
efficiency, where waves = ceil(tiles / SMs) and larger tiles are more
efficient per output; pick the cheapest, larger tiles on ties.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from ..errors import ArgumentError
from ..signature import ARCH_BY_CAPABILITY, Signature
from .load import Cache

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

# Relative throughput per output element of each CTA tile (wgmma efficiency
# and operand reuse); used only to rank variants of one signature.
_TILE_EFFICIENCY = {
    (128, 256): 1.00, (256, 128): 1.00, (128, 128): 0.92,
    (64, 256): 0.85, (64, 128): 0.78, (128, 64): 0.78,
}
_MEMO_LIMIT = 4096

_DEVICE_INFO: dict[int, tuple[str, int]] = {}


def device_info(index: int) -> tuple[str, int]:
    """(arch string, SM count) of a CUDA device, queried once."""
    info = _DEVICE_INFO.get(index)
    if info is None:
        props = torch.cuda.get_device_properties(index)
        arch = ARCH_BY_CAPABILITY.get((props.major, props.minor), f"sm_{props.major}{props.minor}")
        info = (arch, props.multi_processor_count)
        _DEVICE_INFO[index] = info
    return info


class _Route:
    __slots__ = ("signature", "candidates", "sm_count", "choices", "with_c")

    def __init__(self, signature, candidates, sm_count, with_c):
        self.signature = signature
        self.candidates = candidates  # [(tm, tn, cm, cn, key)]
        self.sm_count = sm_count
        self.choices: dict = {}
        self.with_c = with_c


def choose(candidates: list[tuple], m: int, n: int, l: int, sm_count: int) -> tuple:
    """Pick a variant for an M x N x L problem (see module docstring)."""
    best, best_cost = None, math.inf
    for cand in candidates:
        tm, tn, cm, cn, _ = cand
        tiles = -(-m // tm) * -(-n // tn) * l
        waves = max(1, -(-tiles // sm_count))
        cost = waves * tm * tn / _TILE_EFFICIENCY.get((tm, tn), 0.7)
        # clusters help only when there are enough tiles to pair up
        if cm * cn > 1 and tiles < 2 * sm_count:
            cost *= 1.05
        if cost < best_cost or (cost == best_cost and tm * tn > best[0] * best[1]):
            best, best_cost = cand, cost
    return best


class GemmRunner:
    """``runner(a, b, out=None, *, c=None, alpha=1.0, beta=1.0)`` for one cache."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self._routes: dict[tuple, _Route] = {}
        self._lock = threading.Lock()

    def __call__(self, a, b, out=None, *, c=None, alpha=1.0, beta=1.0):
        """D = alpha * a @ b (+ beta * c), written into ``out`` and returned.

        a[M,K] @ b[K,N] -> out[M,N], or batched a[L,M,K] @ b[L,K,N] ->
        out[L,M,N]. ``out`` defaults to a new tensor of a's dtype.
        """
        if out is None:
            out = self._new_out(a, b)
        sa = a.stride()
        dev = a.get_device()
        rkey = (a.dtype, b.dtype, out.dtype, sa[-1] == 1, b.stride()[-1] == 1,
                out.stride()[-1] == 1, len(sa), dev, b.get_device(), out.get_device(),
                None if c is None else (c.dtype, c.stride()[-1] == 1, c.get_device()))
        route = self._routes.get(rkey)
        if route is None:
            route = self._route(rkey, a, b, out, c)
        skey = (a.shape, b.shape)
        fn = route.choices.get(skey)
        if fn is None:
            fn = self._choose(route, a, b, out, c, skey)
        try:
            if c is None:
                fn(a, b, out, alpha, route.sm_count)
            else:
                fn(a, b, out, c, alpha, beta, route.sm_count)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise self._diagnose(route, a, b, out, c, exc) from exc
        return out

    # ------------------------------------------------------------ slow paths
    def _new_out(self, a, b):
        if a.dim() not in (2, 3) or b.dim() != a.dim():
            raise ArgumentError(
                f"gemm takes a[M,K] @ b[K,N] or a[L,M,K] @ b[L,K,N]; got a of shape "
                f"{tuple(a.shape)} and b of shape {tuple(b.shape)}")
        shape = (*a.shape[:-1], b.shape[-1])
        return torch.empty(shape, dtype=a.dtype, device=a.device)

    def _route(self, rkey, a, b, out, c) -> _Route:
        with self._lock:
            route = self._routes.get(rkey)
            if route is not None:
                return route
            sig = self._signature(a, b, out, c)
            _, sm_count = device_info(a.get_device())
            entries = self.cache.by_signature.get(sig)
            if not entries:
                raise self.cache.not_found(sig)
            cands = []
            for e in entries:
                tm, tn = (int(x) for x in e.variant["tile"].split("x"))
                cm, cn = (int(x) for x in e.variant["cluster"].split("x"))
                cands.append((tm, tn, cm, cn, e.key))
            # Keep one entry per tile/cluster (the newest build wins).
            uniq: dict[tuple, tuple] = {}
            for cand in sorted(cands, key=lambda x: self.cache.entries[x[4]].record["built_at"]):
                uniq[cand[:4]] = cand
            route = _Route(sig, list(uniq.values()), sm_count, c is not None)
            self._routes[rkey] = route
            return route

    def _signature(self, a, b, out, c) -> Signature:
        tensors = {"a": a, "b": b, "out": out} | ({} if c is None else {"c": c})
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise ArgumentError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        devs = {name: t.device for name, t in tensors.items()}
        if any(d.type != "cuda" for d in devs.values()):
            raise ArgumentError(
                "gemm runs on CUDA tensors; got devices "
                + ", ".join(f"{n}={d}" for n, d in devs.items())
                + " (move them with .cuda())", devices={n: str(d) for n, d in devs.items()})
        if len(set(devs.values())) > 1:
            raise ArgumentError(
                "gemm operands must be on one GPU; got "
                + ", ".join(f"{n}={d}" for n, d in devs.items()),
                devices={n: str(d) for n, d in devs.items()})
        rank = a.dim()
        if rank not in (2, 3) or any(t.dim() != rank for t in tensors.values()):
            raise ArgumentError(
                "gemm takes 2-D a[M,K], b[K,N], out[M,N] or 3-D a[L,M,K], b[L,K,N], "
                "out[L,M,N] (c like out); got ranks "
                + ", ".join(f"{n}={t.dim()}" for n, t in tensors.items()))
        for name, t in tensors.items():
            if t.dtype not in DTYPE_NAMES:
                raise ArgumentError(
                    f"gemm: {name} has dtype {t.dtype}; supported: float16, bfloat16 "
                    "(inputs), float16, bfloat16, float32 (out, c)", tensor=name)
        arch, _ = device_info(a.get_device())

        def major(t, last: str, first: str) -> str:
            s = t.stride()
            if s[-1] == 1:
                return last
            if s[-2] == 1:
                return first
            raise ArgumentError(
                f"gemm: {name_of(t)} has strides {tuple(s)}: neither of its last two dims is "
                "contiguous; pass a row- or column-major view (e.g. .contiguous())")

        def name_of(t) -> str:
            return next(n for n, x in tensors.items() if x is t)

        d_major = major(out, "n", "m")
        if c is not None:
            if c.dtype != out.dtype or major(c, "n", "m") != d_major:
                raise ArgumentError(
                    f"gemm: c must have out's dtype and layout (out: {out.dtype}, "
                    f"{'row' if d_major == 'n' else 'column'}-major); got {c.dtype}, "
                    f"strides {tuple(c.stride())}", tensor="c")
        return Signature.make("gemm", arch, {
            "a": DTYPE_NAMES[a.dtype], "b": DTYPE_NAMES[b.dtype], "d": DTYPE_NAMES[out.dtype],
            "c": None if c is None else DTYPE_NAMES[c.dtype],
            "a_major": major(a, "k", "m"), "b_major": major(b, "n", "k"), "d_major": d_major,
            "rank": rank, "align": 16,
        })

    def _choose(self, route: _Route, a, b, out, c, skey):
        self._check_shapes(a, b, out, c)
        m, n = a.shape[-2], b.shape[-1]
        l = a.shape[0] if a.dim() == 3 else 1
        if m == 0 or n == 0 or l == 0:
            fn = _empty_problem
        else:
            cand = choose(route.candidates, m, n, l, route.sm_count)
            fn = self.cache.function(cand[4])
        if len(route.choices) >= _MEMO_LIMIT:
            route.choices.clear()
        route.choices[skey] = fn
        return fn

    @staticmethod
    def _check_shapes(a, b, out, c) -> None:
        *la, m, k = a.shape
        *lb, k2, n = b.shape
        want = (*la, m, n)
        if k != k2 or la != lb or tuple(out.shape) != want or (c is not None and tuple(c.shape) != want):
            raise ArgumentError(
                f"gemm shapes do not agree: a{tuple(a.shape)} @ b{tuple(b.shape)} -> "
                f"out{tuple(out.shape)}" + ("" if c is None else f", c{tuple(c.shape)}")
                + f"; expected out (and c) of shape {want}")

    def _diagnose(self, route, a, b, out, c, exc) -> ArgumentError:
        tensors = {"a": a, "b": b, "out": out} | ({} if c is None else {"c": c})
        self._check_shapes(a, b, out, c)
        for name, t in tensors.items():
            item = t.element_size()
            if t.data_ptr() % 16:
                return ArgumentError(
                    f"gemm: {name}'s data pointer is not 16-byte aligned (offset "
                    f"{t.data_ptr() % 16}); the kernels use TMA, which needs 16-byte "
                    "alignment: pass a tensor that starts on an aligned address",
                    tensor=name, reason="alignment")
            for dim, s in enumerate(t.stride()):
                if s != 1 and (s * item) % 16 and t.shape[dim] > 1:
                    return ArgumentError(
                        f"gemm: {name} has stride {s} in dim {dim} ({s * item} bytes), not a "
                        "multiple of 16 bytes; pad its leading dimension (e.g. allocate "
                        f"with a row pitch rounded up to {16 // item} elements)",
                        tensor=name, reason="alignment")
        return ArgumentError(
            f"gemm: the kernel for {route.signature} refused these arguments: {exc}",
            reason="artifact-check")


def _empty_problem(*args) -> None:
    """M, N or L is zero: there is nothing to compute or write."""
    return None
