"""Dispatch: map torch tensors to a precompiled GEMM and launch it.

Run side: imports the standard library, torch and the core modules only.

Three binding tiers:

* Fixed at build time (baked into each artifact): dtypes of A, B, D (and
  C), which dim of each operand is contiguous, rank (2-D or batched 3-D),
  16-byte alignment, tile and cluster shape, raster order, target arch.
* Fixed at first use, per process: the cache index (read once at open);
  whether the visible GPUs are alike (else the device joins the key); per
  call key (output shape, dtypes, B's contiguity, C or not; memoized,
  bounded) the full signature, a shape check, the chosen variant and its
  artifact, verified by sha256 and dlopened on first selection.
* At each call: four tensor reads (out.shape, out.stride(), out.dtype,
  b.stride()), one dict lookup keyed on them, and the artifact call. (out's
  strides are in the key because the artifact cannot tell an output that
  overlaps itself; resolution refuses one. An out that aliases a, b or c is
  the caller's contract, as in BLAS: not checked.) The artifact's compiled
  checks (device type and one device for all operands, dtypes, ranks, equal
  M/N/K/L, the unit stride of each operand's contiguous dim, stride
  divisibility, pointer alignment) run before its launch, so the key need
  not repeat them. If they refuse, the call is resolved in full: a
  different artifact may serve it (retried, and the memo re-pointed), or an
  ArgumentError names the tensor and the fix. Cost of that design: a
  process that alternates, at one output shape and dtype, between two
  layouts of A (or D), or two input dtypes, pays the full resolution on
  each switch; results stay correct. The artifact switches to the tensors' GPU and runs on
  torch's current stream there (TVM-FFI's environment stream), so side
  streams, CUDA graph capture and multi-GPU processes work unchanged.

Choice among variants of one signature (a documented heuristic; no tuned
table yet): estimate each candidate's time as waves x tile work / tile
efficiency, where waves = ceil(tiles / SMs) and larger tiles are more
efficient per output; pick the cheapest, larger tiles on ties.
"""

from __future__ import annotations

import math
import threading

import torch

from ..errors import ArgumentError
from ..layout import GEMM_ABI
from ..signature import ARCH_BY_CAPABILITY, Signature
from .load import Cache

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

# Relative throughput per output element of each CTA tile (wgmma efficiency
# and operand reuse); used only to rank variants of one signature.
_TILE_EFFICIENCY = {
    (128, 256): 1.00, (256, 128): 0.98, (128, 128): 0.92,
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


def choose(candidates: list[tuple], m: int, n: int, batch: int, sm_count: int) -> tuple:
    """Pick a variant for an M x N x L problem (see module docstring).

    ``candidates`` are (tile_m, tile_n, cluster_m, cluster_n, raster,
    swizzle, key) tuples; returns one of them.
    """
    best, best_cost = None, math.inf
    for cand in candidates:
        tm, tn, cm, cn, raster, swizzle, _ = cand
        tiles_m, tiles_n = -(-m // tm), -(-n // tn)
        tiles = tiles_m * tiles_n * batch
        waves = max(1, -(-tiles // sm_count))
        cost = waves * tm * tn / _TILE_EFFICIENCY.get((tm, tn), 0.7)
        cost *= _schedule_factor(cm * cn, raster, swizzle, tiles_m, tiles, sm_count)
        if cost < best_cost:
            best, best_cost = cand, cost
    return best


def _schedule_factor(cluster: int, raster: str, swizzle: int, tiles_m: int, tiles: int, sms: int) -> float:
    """Cost factor (>= 1) for a variant's cluster and tile schedule.

    From the H200 runs in benchmarks/results: a 2x1 cluster (B multicast to
    two M-neighbours) wins once there are at least 4 tiles along M; for
    multi-wave problems, walking M within bands of 8 N-columns (raster m,
    swizzle 8) keeps A and B bands in L2 and wins; single-wave problems
    gain nothing from a swizzle and keep the plain order.
    """
    factor = 1.0
    if cluster > 1:
        factor *= 1.0 if tiles_m >= 4 else 1.05
    elif tiles_m >= 4:
        factor *= 1.01
    if tiles > 2 * sms:
        factor *= {("m", 8): 1.0, ("m", 4): 1.003, ("n", 8): 1.006, ("n", 4): 1.006}.get(
            (raster, swizzle), 1.01)
    elif (raster, swizzle) != ("m", 1):
        factor *= 1.01
    return factor


class GemmRunner:
    """``runner(a, b, out=None, *, c=None, alpha=1.0, beta=1.0)`` for one cache."""

    def __init__(self, cache: Cache):
        self.cache = cache
        # (out.shape, out.stride(), out.dtype, b row-major?, no C?[, device]) -> (fn, sm_count)
        self._memo: dict[tuple, tuple] = {}
        self._candidates: dict[Signature, list[tuple]] = {}
        self._per_device: bool | None = None
        self._lock = threading.Lock()

    def __call__(self, a, b, out=None, *, c=None, alpha=1.0, beta=1.0):
        """Same as the closure from ``entry()``; kept for direct use."""
        return self.entry()(a, b, out, c=c, alpha=alpha, beta=beta)

    def entry(self):
        """The per-call entry point, as a closure.

        A closure over local names costs measurably less per call than a
        bound ``__call__`` reading ``self`` attributes (about 0.4 µs on the
        build machine), and this is the hot path.
        """
        fn_entry = getattr(self, "_entry", None)
        if fn_entry is not None:
            return fn_entry
        memo_get = self._memo.get
        resolve, fallback = self._resolve, self._fallback
        new_out, not_tensors = self._new_out, self._not_tensors
        per_device = self._per_device = torch.cuda.is_available() and _heterogeneous()

        def gemm(a, b, out=None, *, c=None, alpha=1.0, beta=1.0):
            """D = alpha * a @ b (+ beta * c), written into ``out`` and returned.

            a[M,K] @ b[K,N] -> out[M,N], or batched a[L,M,K] @ b[L,K,N] ->
            out[L,M,N]. ``out`` defaults to a new tensor of a's dtype.
            """
            if out is None:
                out = new_out(a, b)
            # The key holds only what tells apart artifacts that could
            # *succeed* for this call; the rest (A's, B's and C's dtype, A's
            # and D's majorness, equal M/N/K/L, divisibility, alignment, one
            # device) is enforced by the artifact's compiled checks before it
            # launches, and a refusal falls through to the full resolution.
            try:
                key = (out.shape, out.stride(), out.dtype, b.stride()[-1] == 1, c is None)
                if per_device:
                    key += (a.get_device(),)
            except (AttributeError, TypeError, IndexError, RuntimeError):
                # not tensors, 0-dim, or layouts without strides (sparse, nested)
                raise not_tensors(a, b, out, c) from None
            hit = memo_get(key)
            if hit is None:
                hit = resolve(key, a, b, out, c)
            fn, sms = hit
            try:
                if c is None:
                    fn(a, b, out, alpha, sms)
                else:
                    fn(a, b, out, c, alpha, beta, sms)
            except (ValueError, TypeError, RuntimeError) as exc:
                return fallback(key, hit, a, b, out, c, alpha, beta, exc)
            return out

        gemm.runner = self
        self._entry = gemm
        return gemm

    # ------------------------------------------------------------ slow paths
    @staticmethod
    def _not_tensors(a, b, out, c) -> ArgumentError:
        given = {"a": a, "b": b, "out": out, "c": c}
        bad = {n: type(t).__name__ for n, t in given.items()
               if t is not None and not (isinstance(t, torch.Tensor) and t.dim() >= 1)}
        return ArgumentError(
            "gemm takes torch.Tensors of rank 2 or 3; got "
            + ", ".join(f"{n}: {v}" for n, v in bad.items()), tensors=bad)

    def _new_out(self, a, b):
        """Allocate out for a call without one, after checking what decides its shape."""
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            raise self._not_tensors(a, b, None, None)
        if a.layout != torch.strided or b.layout != torch.strided:
            raise ArgumentError(f"gemm takes dense (strided) tensors; got {a.layout} and {b.layout}")
        if a.dim() not in (2, 3) or b.dim() != a.dim():
            raise ArgumentError(
                f"gemm takes a[M,K] @ b[K,N] or a[L,M,K] @ b[L,K,N]; got a of shape "
                f"{tuple(a.shape)} and b of shape {tuple(b.shape)}")
        if a.device != b.device or a.device.type != "cuda":
            raise ArgumentError(
                f"gemm runs on one CUDA device; got a on {a.device}, b on {b.device} "
                "(move them with .cuda())", devices={"a": str(a.device), "b": str(b.device)})
        if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
            raise ArgumentError(
                f"gemm shapes do not agree: a{tuple(a.shape)} @ b{tuple(b.shape)}")
        shape = (*a.shape[:-1], b.shape[-1])
        try:
            return torch.empty(shape, dtype=a.dtype, device=a.device)
        except RuntimeError as exc:  # out of memory, mostly
            raise ArgumentError(f"gemm could not allocate out{shape}: {exc}") from exc

    def _resolve(self, key, a, b, out, c) -> tuple:
        """Full resolution for a new key: signature, shapes, variant, load."""
        with self._lock:
            sig = self._signature(a, b, out, c)
            self._check_shapes(a, b, out, c)
            _check_no_internal_overlap(out)
            _, sm_count = device_info(a.get_device())
            m, n = a.shape[-2], b.shape[-1]
            batch = a.shape[0] if a.dim() == 3 else 1
            if m == 0 or n == 0 or batch == 0:
                return (_empty_problem, sm_count)  # not memoized: shapes re-checked each call
            else:
                cand = choose(self._candidates_for(sig), m, n, batch, sm_count)
                hit = (self.cache.function(cand[-1]), sm_count)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = hit
            return hit

    def _candidates_for(self, sig: Signature) -> list[tuple]:
        cands = self._candidates.get(sig)
        if cands is None:
            # Only artifacts with the GEMM calling convention (a user family
            # with op "gemm" but another ABI must not be called this way).
            entries = [e for e in self.cache.by_signature.get(sig, ()) if e.record["abi"] == GEMM_ABI]
            if not entries:
                raise self.cache.not_found(sig)
            # One entry per schedule; the newest build wins.
            uniq: dict[tuple, tuple] = {}
            for e in sorted(entries, key=lambda e: e.record["built_at"]):
                v = e.variant
                tm, tn = (int(x) for x in v["tile"].split("x"))
                cm, cn = (int(x) for x in v["cluster"].split("x"))
                sched = (tm, tn, cm, cn, v.get("raster", "m"), int(v.get("swizzle", 1)))
                uniq[sched] = (*sched, e.key)
            cands = self._candidates[sig] = list(uniq.values())
        return cands

    def _fallback(self, key, hit, a, b, out, c, alpha, beta, exc):
        """The memoized artifact refused the call: resolve in full, retry once.

        Either another artifact serves these arguments (a layout or device
        the short key does not tell apart: the memo is pointed at it), or
        the arguments are bad and a specific ArgumentError says why.
        """
        self._memo.pop(key, None)
        fresh = self._resolve(key, a, b, out, c)  # raises for bad signature/shape
        if fresh[0] is not hit[0]:
            try:
                if c is None:
                    fresh[0](a, b, out, alpha, fresh[1])
                else:
                    fresh[0](a, b, out, c, alpha, beta, fresh[1])
                return out
            except (ValueError, TypeError, RuntimeError) as exc2:
                exc = exc2
        self._memo.pop(key, None)
        raise self._diagnose(a, b, out, c, exc) from exc

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

    def _diagnose(self, a, b, out, c, exc) -> ArgumentError:
        """Name what is wrong with arguments an artifact refused."""
        tensors = {"a": a, "b": b, "out": out} | ({} if c is None else {"c": c})
        sig = self._signature(a, b, out, c)
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
            f"gemm: the kernel for {sig} refused these arguments: {exc}",
            reason="artifact-check")


def _check_no_internal_overlap(out) -> None:
    """Refuse an output whose elements share memory (stride 0, overlapping rows).

    The artifact's checks accept any 16-byte-divisible stride, 0 included, so
    such an output would launch and race on itself. Sufficient test: ordered
    by stride, each dim of size > 1 must step past the whole extent of the
    dims inside it.
    """
    dims = sorted((s, n) for s, n in zip(out.stride(), out.shape) if n > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            raise ArgumentError(
                f"gemm: out of shape {tuple(out.shape)} and strides {tuple(out.stride())} has "
                "elements that share memory (a broadcast or overlapping view); write into a "
                "tensor whose rows do not overlap", tensor="out", reason="overlap")
        extent = stride * size


def _heterogeneous() -> bool:
    """Whether visible GPUs differ in arch or SM count (then the key needs the device)."""
    infos = {device_info(i) for i in range(torch.cuda.device_count())}
    return len(infos) > 1


def _empty_problem(*args) -> None:
    """M, N or L is zero: there is nothing to compute or write."""
    return None
