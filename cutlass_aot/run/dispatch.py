"""Dispatch: the hot path from torch tensors to a precompiled GEMM launch.

Run side: imports the standard library, torch and the core modules only.
Every decision (signature, shape checks, variant and split choice) lives in
run/select.py as a pure function; this module reads tensor metadata, asks
select, memoizes the answer and launches.

Three binding tiers:

* Fixed at build time (baked into each artifact): dtypes of A, B, D (and
  C, bias), which dim of each operand is contiguous, rank, 16-byte
  alignment, tile and cluster shape, raster and swizzle, swap-AB, split-K,
  the activation, the target arch.
* Fixed at first use, per process and per memo key (out.shape, out.stride(),
  out.dtype, b.stride(), K, whether C and bias are given, the activation[,
  the device]): the full signature, shape and overlap checks, the choice
  (table row or model; with autotune on, the fastest of the model's leading
  options timed on this first call: run/autotune.py) and its loaded artifact.
* At each call: a few tensor reads, one dict lookup, and the artifact call
  (plus, for a split-K choice, one torch.empty of fp32 scratch from torch's
  caching allocator on the current stream, which CUDA graph capture pools).

The artifact's compiled checks (device type and one device for all
operands, dtypes, ranks, equal M/N/K/L, unit strides, stride divisibility,
pointer alignment) run before its launch, so the key need not repeat them.
When they refuse (ValueError/TypeError from tvm-ffi), the call is resolved
in full: another artifact may serve it (the memo is re-pointed), or an
ArgumentError names the tensor and the fix. A RuntimeError from a launch is
not an argument problem: it surfaces as a LaunchError that keeps the CUDA
message (a fault, a sticky error, out of memory), unless a full check finds
the arguments at fault.

Calls below 16-byte alignment (an odd K or N, a view at an odd offset) are
served by the 16-byte variants *staged* (the misaligned operands copied into
16-byte pitched scratch, out copied back: ``_staged_launcher``), or natively
by a low-alignment family (sm80_gemm's ``align`` 8/4/2) where the cache has
one and select.prefer_staged finds it faster (``_unaligned_route``).

BLAS edge semantics: ``beta == 0`` means C is not read (NaN in C does not
propagate); K == 0 gives D = beta * C, or zeros, as torch.mm does; M, N or
L == 0 launches nothing.
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
import weakref

import torch
from torch.autograd import forward_ad as _forward_ad

from .. import archs, knobs
from ..errors import ArgumentError, KernelNotFoundError, LaunchError, UsageError
from ..signature import ARCH_BY_CAPABILITY, GEMM_ACTS, Signature, splitk_workspace_elems
from . import autotune, fastpath, occupancy, pitch, select
from .fallback import torch_gemm
from .load import Cache

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
_MEMO_LIMIT = 4096
# The C++ entry keys a call on more fields than the memo (a's strides, say),
# so one memo key can register several layouts; past this many
# registrations its table is cleared (it refills from the memo, call by call).
_FAST_LIMIT = 4 * _MEMO_LIMIT
_DEVICE_INFO: dict[int, tuple[str, int, str, str]] = {}


def device_info(index: int) -> tuple[str, int, str, str]:
    """(arch string, SM count, product name, "major.minor") of a CUDA device, once."""
    info = _DEVICE_INFO.get(index)
    if info is None:
        props = torch.cuda.get_device_properties(index)
        arch = ARCH_BY_CAPABILITY.get((props.major, props.minor), f"sm_{props.major}{props.minor}")
        info = (arch, props.multi_processor_count, props.name, f"{props.major}.{props.minor}")
        _DEVICE_INFO[index] = info
    return info


class GemmRunner:
    """``runner(a, b, out=None, *, c=None, bias=None, act=None, alpha=1.0, beta=1.0)``."""

    def __init__(self, cache: Cache, *, fast: bool = True):
        """``fast=False``: never the C++ entry (run/fastpath.py), for comparison."""
        self.cache = cache
        self._memo: dict[tuple, tuple] = {}
        # Per memo key, what the overlap check needs of it (_alias_spans).
        self._spans: dict[tuple, tuple] = {}
        # The C++ entry (run/fastpath.py), or None; per memo key, what it
        # registers for a call of that key: (artifact, SM count, splits,
        # split-K scratch elements), for the choices it can launch alone.
        self._fast = fastpath.load() if fast else None
        self._fast_table = fastpath.new_table()
        self._fast_regs: dict[tuple, tuple] = {}
        self._fast_count = [0]  # keys new to the C++ table since it was last cleared
        if self._fast is not None:
            # A runner that goes away takes its C++ entries (and the artifacts
            # they hold) with it; at exit the table is left to the OS.
            weakref.finalize(self, self._fast.clear, self._fast_table).atexit = False
        self._candidates: dict[Signature, list[select.Candidate]] = {}
        self._per_device: bool | None = None
        self._lock = threading.Lock()
        self.last_choice: dict[tuple, select.Choice] = {}
        self.unaligned = knobs.unaligned_route()
        self.autotune = knobs.autotune_count()

    def set_autotune(self, count: int) -> None:
        """Time the model's ``count`` leading options on each new key's first
        call and keep the fastest (run/autotune.py); 0 turns it off. Forgets
        every memoized choice."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0 or count == 1:
            raise UsageError(f"autotune count {count!r}: use 0 (off) or a number of options >= 2")
        with self._lock:
            self.autotune = count
            self._forget()

    def set_unaligned(self, route: str) -> None:
        """Route calls below 16-byte alignment: "auto", "staged" or "native"
        (knobs.unaligned_route); forgets every memoized choice."""
        if route not in knobs.UNALIGNED_CHOICES:
            raise UsageError(f"unaligned route {route!r}: use one of {', '.join(knobs.UNALIGNED_CHOICES)}")
        with self._lock:
            self.unaligned = route
            self._forget()

    def _forget(self) -> None:
        """Drop every memoized choice, here and in the C++ entry (under the lock)."""
        self._memo.clear()
        self._spans.clear()
        self.last_choice.clear()
        if self._fast_regs:
            self._fast_regs.clear()
            self._clear_fast()

    def _clear_fast(self) -> None:
        self._fast_count[0] = 0
        self._fast.clear(self._fast_table)

    def fast_entries(self) -> int:
        """Calls' layouts the C++ entry serves for this runner (0 without it)."""
        return 0 if self._fast is None else int(self._fast.size(self._fast_table))

    def __call__(self, a, b, out=None, *, c=None, bias=None, act=None, alpha=1.0, beta=1.0):
        """Same as the closure from ``entry()``; kept for direct use."""
        return self.entry()(a, b, out, c=c, bias=bias, act=act, alpha=alpha, beta=beta)

    def entry(self):
        """The per-call entry point, as a closure.

        A closure over local names costs measurably less per call than a
        bound ``__call__`` reading ``self`` attributes, and this is the hot path.
        """
        fn_entry = getattr(self, "_entry", None)
        if fn_entry is not None:
            return fn_entry
        memo_get, fast_regs, fast_count = self._memo.get, self._fast_regs, self._fast_count
        spans_get = self._spans.get
        resolve, fallback = self._resolve, self._fallback
        new_out, not_tensors = self._new_out, self._not_tensors
        per_device = self._per_device = torch.cuda.is_available() and _heterogeneous()
        fast, table = self._fast, self._fast_table
        fast_call = None if fast is None else fast.call
        fast_register = None if fast is None else fast.register
        fast_call_bias = None if fast is None else fast.call_bias
        fast_register_bias = None if fast is None else fast.register_bias
        fast_call_c = None if fast is None else fast.call_c
        fast_register_c = None if fast is None else fast.register_c
        act_code, no_act, with_c = fastpath.ACT_CODES.get, fastpath.NO_ACT, fastpath.WITH_C
        grad_enabled, fw_level = torch.is_grad_enabled, _forward_ad_level
        # The kernel writes the caller's out through DLPack, unseen by autograd:
        # its version counter is bumped as torch's out= functions bump it, so
        # a tensor autograd saved and a kernel then overwrote is an error at
        # backward, not a wrong gradient (torch.autograd.graph.increment_version;
        # a tuple: a bare tensor is iterated, bumping it once per row).
        bump = _version_bump()

        def gemm(a, b, out=None, *, c=None, bias=None, act=None, alpha=1.0, beta=1.0):
            """D = act(alpha * a @ b + beta * c + bias), written into ``out`` and returned.

            a[M,K] @ b[K,N] -> out[M,N], or batched a[L,M,K] @ b[L,K,N] ->
            out[L,M,N]. ``out`` defaults to a new tensor of a's dtype; ``bias``
            is a vector of length N; ``act`` one of none, relu, gelu (tanh
            approximation), gelu_erf, silu. beta = 0 does not read ``c``.
            """
            if c is not None:
                # Before the guards below, which must see the c the kernel reads
                try:
                    if not beta:
                        c = None  # BLAS: beta = 0 means C is not read
                except (RuntimeError, TypeError, ValueError):  # a tensor of several values, say
                    raise _scalar_refusal("beta", beta) from None
            try:
                # A kernel writes out behind autograd's back and records no
                # graph: a call autograd would have to differentiate, or a
                # tangent it would drop, is refused (as torch's out= functions
                # and the custom op refuse it). Grad mode off: one call.
                if (grad_enabled() and (a.requires_grad or b.requires_grad
                                        or (out is not None and out.requires_grad)
                                        or (c is not None and c.requires_grad)
                                        or (bias is not None and bias.requires_grad))) \
                        or fw_level() >= 0:
                    raise _autograd_refusal()
                # A lazily negated view (torch._neg_view; x.conj().imag of a
                # complex x) crosses DLPack as its memory, unnegated: checked
                # every call, since neither key below can see the bit.
                if a.is_neg() or b.is_neg() or (out is not None and out.is_neg()) \
                        or (c is not None and c.is_neg()) or (bias is not None and bias.is_neg()):
                    raise _neg_refusal(a=a, b=b, out=out, c=c, bias=bias)
            except AttributeError:
                # not tensors: named now, not after guards they slipped past
                raise not_tensors(a, b, out, c, bias) from None
            fresh = out is None  # a new out aliases nothing: no overlap check
            if fresh:
                out = new_out(a, b)
            # the C++ entry missed: the code it keyed on (NO_ACT: the plain
            # entry; an activation's code, plus WITH_C for a call with c)
            missed = None
            if fast_call is not None:
                # The C++ entry (run/fastpath.py): keyed on every tensor
                # field (and the activation), so a hit is this call's own
                # registered answer.
                served = False
                try:
                    if c is None and bias is None and act is None:
                        served = fast_call(table, a, b, out, alpha)
                        missed = no_act
                    else:
                        code = act_code(act)  # None: not an activation (the path below says so)
                        if code is None:
                            pass
                        elif c is None:
                            served = fast_call_bias(table, a, b, out, bias, code, alpha)
                            missed = code
                        else:
                            served = fast_call_c(table, a, b, out, bias, code, c, alpha, beta)
                            missed = code + with_c
                except (ValueError, TypeError, RuntimeError):
                    pass  # the path below resolves, routes or diagnoses the call
                if served:  # (outside the try: nothing after a launch may launch again)
                    if not fresh:
                        bump((out,))
                    return out
            try:
                # a's and c's strides: with the rest, they fix every operand's
                # extent, which resolution checks (select.within_index_limit)
                key = (out.shape, out.stride(), out.dtype, a.stride(), b.stride(), a.shape[-1],
                       None if c is None else c.stride(), bias if bias is None else bias.dtype, act,
                       a.dtype)
                if per_device:
                    key += (a.get_device(),)
            except (AttributeError, TypeError, IndexError, RuntimeError):
                # not tensors, 0-dim, or layouts without strides (sparse, nested)
                raise not_tensors(a, b, out, c, bias) from None
            try:
                hit = memo_get(key)
            except TypeError:  # an act that cannot be a key (a list, a dict): not an activation
                raise ArgumentError(f"gemm: act must be one of {', '.join(GEMM_ACTS)} (a string) or "
                                    f"None; got {act!r}", act=repr(act)) from None
            if hit is None:
                hit = resolve(key, a, b, out, c, bias, act)  # checks overlap and storage itself
            else:
                try:
                    if not fresh:
                        # out must not share memory with what the kernel reads
                        # (select.check_no_alias): a few pointer compares, and
                        # the exact check only where two byte ranges meet. The
                        # spans are resolve's, from a call whose shapes it
                        # checked (this call's own if another thread has just
                        # cleared them). A null pointer is refused there too.
                        spans = spans_get(key)
                        if spans is None:
                            spans = _alias_spans(a, b, out, c, bias)
                        if _may_alias(spans, a, b, out, c, bias):
                            _check_alias(a, b, out, c, bias)
                    # A tensor without storage of its own (a fake, zero or
                    # wrapper tensor) crosses DLPack with a null pointer
                    # (the C++ entry misses on one): refused, not launched.
                    elif (not (a.data_ptr() and b.data_ptr()) or (c is not None and not c.data_ptr())
                          or (bias is not None and not bias.data_ptr())) \
                            and any(_no_storage(t) for t in (a, b, c, bias) if t is not None):
                        # (a null pointer of an empty operand, K = 0's, is no fault)
                        raise _storage_refusal(a=a, b=b, out=out, c=c, bias=bias)
                except RuntimeError:  # no storage at all (vmap's BatchedTensor)
                    raise _storage_refusal(a=a, b=b, out=out, c=c, bias=bias) from None
            if missed is not None:
                reg = fast_regs.get(key)
                if reg is not None:
                    if missed == no_act:
                        got = fast_register(table, a, b, out, *reg)
                    elif missed >= with_c:
                        got = fast_register_c(table, a, b, out, bias, missed - with_c, c, *reg)
                    else:
                        got = fast_register_bias(table, a, b, out, bias, missed, *reg)
                    # count new keys only: a layout the C++ half cannot
                    # tell (two dims of blocks, a walk past its budget)
                    # re-registers its key every call
                    if got == 1:
                        fast_count[0] += 1
                        if fast_count[0] > _FAST_LIMIT:
                            self._clear_fast()
            fn, sms, launch = hit
            try:
                if launch is not None:
                    launch(a, b, out, c, bias, alpha, beta)
                elif c is None:
                    fn(a, b, out, alpha, sms)
                else:
                    fn(a, b, out, c, alpha, beta, sms)
            except (ValueError, TypeError, RuntimeError) as exc:
                out = fallback(key, hit, a, b, out, c, bias, act, alpha, beta, exc)
            if not fresh:
                bump((out,))
            return out

        gemm.runner = self
        self._entry = gemm
        return gemm

    # ------------------------------------------------------------ slow paths
    @staticmethod
    def _not_tensors(a, b, out, c, bias=None) -> ArgumentError:
        given = {"a": a, "b": b, "out": out, "c": c, "bias": bias}

        def problem(name, t):
            if t is None:
                return "None" if name in ("a", "b") else None  # out, c, bias are optional
            if not isinstance(t, torch.Tensor):
                return type(t).__name__
            if t.is_nested or t.layout != torch.strided:
                return f"a {'nested' if t.is_nested else str(t.layout)} tensor"
            return f"a {t.dim()}-d tensor" if t.dim() < 1 else None

        bad = {n: p for n, t in given.items() if (p := problem(n, t)) is not None}
        return ArgumentError(
            "gemm takes dense (strided) torch.Tensors of rank 2 or 3 (bias: rank 1); got "
            + (", ".join(f"{n}: {v}" for n, v in bad.items()) or "tensors without strides"),
            tensors=bad)

    def _new_out(self, a, b):
        """Allocate out for a call without one, after checking what decides its shape."""
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.is_nested or b.is_nested:
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

    def _signature(self, a, b, out, c, bias, act) -> Signature:
        tensors = {"a": a, "b": b, "out": out} | ({} if c is None else {"c": c}) \
            | ({} if bias is None else {"bias": bias})
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise ArgumentError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.is_neg():  # the entry checks every call; this, callers past it
                raise _neg_refusal(**tensors)
        devs = {name: t.device for name, t in tensors.items()}
        if any(d.type != "cuda" for d in devs.values()):
            raise ArgumentError(
                "gemm runs on CUDA tensors; got devices "
                + ", ".join(f"{n}={d}" for n, d in devs.items())
                + " (move them with .cuda())", devices={n: str(d) for n, d in devs.items()})
        if any(_no_storage(t) for t in tensors.values()):  # memo hits check where they read pointers
            raise _storage_refusal(**tensors)
        if len(set(devs.values())) > 1:
            raise ArgumentError(
                "gemm operands must be on one GPU; got "
                + ", ".join(f"{n}={d}" for n, d in devs.items()),
                devices={n: str(d) for n, d in devs.items()})
        for name, t in tensors.items():
            if t.dtype not in DTYPE_NAMES:
                raise ArgumentError(
                    f"gemm: {name} has dtype {t.dtype}; supported: float16, bfloat16 "
                    "(inputs), float16, bfloat16, float32 (out, c, bias)", tensor=name)
        act = "none" if act is None else act
        if act not in GEMM_ACTS:
            raise ArgumentError(f"gemm: unknown act {act!r}; one of {', '.join(GEMM_ACTS)}",
                                act=act)
        arch = device_info(a.get_device())[0]
        return select.call_signature(
            arch, {n: DTYPE_NAMES[t.dtype] for n, t in tensors.items()},
            {n: tuple(t.shape) for n, t in tensors.items()},
            {n: tuple(t.stride()) for n, t in tensors.items()}, act)

    def _resolve(self, key, a, b, out, c, bias, act) -> tuple:
        """Full resolution for a new key: signature, shapes, choice, load."""
        with self._lock:
            if len(self._memo) >= _MEMO_LIMIT:
                self._forget()  # before this call's answer is stored, not after (choice_for reads it)
            fast_reg = None  # what the C++ entry may serve this key with (run/fastpath.py)
            sig = self._signature(a, b, out, c, bias, act)
            m, n, k, batch = select.check_shapes(
                tuple(a.shape), tuple(b.shape), tuple(out.shape),
                None if c is None else tuple(c.shape))
            select.check_no_internal_overlap(tuple(out.shape), tuple(out.stride()))
            # Before anything launches (autotune times options into out):
            # out must not share memory with what the kernels read.
            spans = _alias_spans(a, b, out, c, bias)
            if _may_alias(spans, a, b, out, c, bias):
                _check_alias(a, b, out, c, bias)
            arch, sms, name, cc = device_info(a.get_device())
            if m == 0 or n == 0 or batch == 0:
                return (None, sms, _empty_problem)  # not memoized: shapes re-checked each call
            stats = self.cache.counters
            call_align = 16
            try:
                if k != 0:
                    sig, call_align = self._serving_signature(sig, arch, a, b, out, c)
                staged_refusal = None  # the staged route cannot reach a padded copy: native only
                cands = None
                if k != 0:
                    fitting, staged = self._fitting(sig, arch, a), select.staged(sig, call_align)
                    try:
                        cands = self._indexable(sig, fitting, a, b, out, c, staged)
                    except KernelNotFoundError as exc:
                        # A staged call's copies span more than the caller's
                        # tensors; a low-alignment variant reads those and may
                        # still serve (_unaligned_route): resolution goes on.
                        if not staged or not self._native(sig, arch, call_align, a, b, out, c)[1]:
                            raise
                        staged_refusal = exc
                        cands = self._indexable(sig, fitting, a, b, out, c)
            except KernelNotFoundError as exc:
                # A coverage gap (the arguments passed every check above):
                # count it, log its shape, then raise or run it through torch.
                sig = getattr(exc, "miss_signature", sig)
                if self.cache.on_miss != "torch":
                    stats.record_miss(sig, m, n, k, batch)
                    raise
                launch = _torch_launcher(stats.record_fallback(sig, m, n, k, batch, count=0),
                                         act, a, b, c, bias)
                cands, hit = None, (launch, sms, launch)  # fn slot: unique per resolution
            if k == 0:
                k_zero = _k_zero_launcher(sig, a, b, c, bias)
                hit = (k_zero, sms, k_zero)  # fn slot: unique per resolution (_route)
            elif cands is not None:
                rows = self.cache.table_rows(sig, name, sms, cc)
                choice = select.choose(cands, m, n, k, batch, sms, rows,
                                       a.element_size(), out.element_size(),
                                       above=select.row_above_serves(dict(sig.fields)))
                # out's rows end off a 16-byte boundary inside its pitch: a
                # variant that stores whole chunks writes it through scratch
                edge = pitch.odd_edge(out)
                if select.staged(sig, call_align):
                    sig, choice = self._unaligned_route(sig, choice, arch, call_align, a, b, out, c,
                                                        (m, n, k, batch), sms, edge, staged_refusal)
                    hit = _memo_entry(self.cache, choice, sms, m, n, batch, bias is not None, k=k,
                                      device=a.get_device(), odd_edge=edge)
                elif self.autotune and choice.source not in select.TABLE_SOURCES \
                        and not select.autotune_defers(choice, m, n, k, batch) \
                        and not torch.cuda.is_current_stream_capturing():
                    choice, hit = self._autotuned(choice, cands, (m, n, k, batch), sms, a, b, out,
                                                  c, bias, edge)
                else:
                    hit = _memo_entry(self.cache, choice, sms, m, n, batch, bias is not None, k=k,
                                      device=a.get_device(), odd_edge=edge)
                if getattr(hit[2], "staged", False) and not choice.staged:
                    choice = dataclasses.replace(choice, staged=True)  # out only: its edge
                # once per dispatch key: the hot path counts nothing
                stats.record_hit(sig, m, n, k, batch, staged=choice.staged)
                self.last_choice[key] = choice
                if self._fast is not None:
                    fast_reg = _fast_registration(hit)
            if key in self._fast_regs:  # re-resolved: the C++ entry may hold the old answer
                self._fast_regs.pop(key)
                self._clear_fast()
            if fast_reg is not None:
                self._fast_regs[key] = fast_reg
            if spans[0]:  # from this call's tensors, whose shapes passed the checks above
                self._spans[key] = spans
            self._memo[key] = hit
            return hit

    def _autotuned(self, choice: select.Choice, cands, problem: tuple, sms: int, a, b, out, c,
                   bias, odd_edge: bool = False) -> tuple[select.Choice, tuple]:
        """Time ``choice`` and the model's other leading options on this call's
        operands; the fastest, with its memo entry (run/autotune.py). With
        ``odd_edge``, each option that stores whole chunks is timed, as it
        will run, writing out through scratch."""
        m, n, k, batch = problem
        options = autotune.leading_options(cands, m, n, k, batch, sms, self.autotune,
                                           a.element_size(), out.element_size(), first=choice)
        hits = [_memo_entry(self.cache, ch, sms, m, n, batch, bias is not None, k=k,
                            device=a.get_device(), odd_edge=odd_edge)
                for ch, _ in options]
        if len(hits) < 2:
            return choice, hits[0]
        target = out
        if c is not None and c.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            # an in-place residual: timing runs must not overwrite the C they read
            target = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
        runs = [lambda h=h: _launch(h, a, b, target, c, bias, 1.0, 1.0) for h in hits]
        try:
            best, _ = autotune.fastest(runs, [est for _, est in options], a.get_device())
        except (ValueError, TypeError, RuntimeError):
            # Timing is an optimization: if an option refuses these operands
            # or a launch fails, the table's or model's choice stands, and
            # the call itself reports what is wrong.
            return choice, hits[0]
        return dataclasses.replace(options[best][0], source="autotune"), hits[best]

    def _serving_signature(self, sig: Signature, arch: str, a, b, out, c) -> tuple[Signature, int]:
        """(signature whose artifacts serve this call, the call's alignment in bytes).

        In select.signature_order: the 16-byte aligned signature on the
        device's arch (TMA + wgmma), then on the other archs the device runs;
        a call below 16-byte alignment takes those *staged* (its misaligned
        operands copied into 16-byte pitched scratch: ``_staged_launcher``).
        Then the low-alignment signatures the call's pointers and strides
        allow. Reads the tensors' data pointers: resolution only, never the
        hot path.
        """
        tensors = (a, b, out) if c is None else (a, b, out, c)
        call_align = archs.call_alignment(
            (t.data_ptr(), t.stride(), t.element_size()) for t in tensors)
        for cand in select.signature_order(sig, call_align, archs.runnable_archs(arch)):
            if self._gemm_entries(cand):
                return cand, call_align
        # What to build: the 16-byte signature of the device's arch, which
        # serves every call (an unaligned one staged).
        exc = self.cache.arch_not_found(sig, arch) or self.cache.not_found(sig)
        exc.miss_signature = sig
        raise exc

    def _native(self, sig: Signature, arch: str, call_align: int, a, b, out, c) -> tuple:
        """(the first low-alignment signature with entries that this call's
        alignment allows, or None; its candidates that fit the device and
        reach the call's operands)."""
        native_sig = next(
            (s for s in select.signature_order(sig, call_align, archs.runnable_archs(arch))
             if not select.staged(s, call_align) and self._gemm_entries(s)), None)
        if native_sig is None:
            return None, []
        return native_sig, select.within_index_limit(
            select.fits_device(self._candidates_for(native_sig), arch, a.element_size()),
            _operand_spans(a, b, out, c))

    def _unaligned_route(self, sig: Signature, choice: select.Choice, arch: str, call_align: int,
                         a, b, out, c, problem: tuple, sms: int, odd_edge: bool = False,
                         staged_refusal: KernelNotFoundError | None = None
                         ) -> tuple[Signature, select.Choice]:
        """A call below 16-byte alignment: staged on ``choice``, or native on a low-alignment variant.

        select.prefer_staged weighs the staged route (the aligned choice's
        estimate plus a copy per misaligned operand) against the best
        low-alignment variant the call's alignment allows, if the cache
        has one. ``self.unaligned`` ("staged", "native") overrides it.
        """
        native_sig, native_cands = self._native(sig, arch, call_align, a, b, out, c)
        m, n, k, batch = problem
        in_bytes, out_bytes = a.element_size(), out.element_size()
        native = None
        if native_cands:
            native = select.model_choice(native_cands, m, n, k, batch, sms, in_bytes, out_bytes)
        if staged_refusal is not None:  # the padded copies pass 2**31: native (_resolve checked one exists)
            return native_sig, native
        out_staged = odd_edge and _stages_out(self.cache, choice)  # pitch.odd_edge
        copies = [t.numel() * t.element_size() for t in (a, b, out, c)
                  if t is not None and (not pitch.aligned16(t) or (t is out and out_staged))]
        if native is None or self.unaligned == "staged" or (
                self.unaligned == "auto" and select.prefer_staged(
                    choice, native, int(native_sig.get("align")), copies, m, n, k, batch, sms,
                    in_bytes, out_bytes)):
            return sig, dataclasses.replace(choice, staged=True)
        return native_sig, native

    def _gemm_entries(self, sig: Signature) -> list:
        """The cache's entries of ``sig`` with a GEMM calling convention (a user
        family with op "gemm" but another ABI must not be called this way)."""
        return select.gemm_entries(self.cache.by_signature.get(sig, ()))

    def _candidates_for(self, sig: Signature) -> list[select.Candidate]:
        cands = self._candidates.get(sig)
        if cands is None:
            cands = select.entry_candidates(self.cache.by_signature.get(sig, ()))
            if not cands:
                raise self.cache.not_found(sig)
            self._candidates[sig] = cands
        return cands

    def _fitting(self, sig: Signature, arch: str, a) -> list:
        """``sig``'s candidates that fit one CTA's shared memory on the device
        (select.fits_device: an sm_80 build of more than 99 KiB on an
        sm_86/sm_89 GPU would fail to launch); KernelNotFoundError if none do."""
        cands = self._candidates_for(sig)
        if sig.arch == arch:
            return cands  # the build checked its own arch's capacity
        fit = select.fits_device(cands, arch, a.element_size())
        if not fit:
            raise KernelNotFoundError(
                f"no cutlass-aot artifact in cache {self.cache.path} can serve this call of {sig} on "
                f"this {arch} GPU: every variant of that {sig.arch} signature needs more shared memory "
                f"than one CTA may use on {arch} ({archs.SMEM_OPTIN.get(arch)} bytes). Build the "
                f"signature for {arch}, or sm_80 variants within 99 KiB, or open the cache with "
                "on_miss=\"torch\"", signature=str(sig), nearest=[], cache_dir=str(self.cache.path))
        return fit

    def _indexable(self, sig: Signature, cands: list, a, b, out, c, staged: bool = False) -> list:
        """``cands`` less those whose 32-bit layout offsets cannot reach this
        call's operands (select.within_index_limit); KernelNotFoundError (a
        coverage gap: on_miss="torch" runs it through torch) if none can.
        ``staged``: the call is below ``sig``'s alignment, so its misaligned
        operands reach the kernel as padded copies (``_operand_spans``)."""
        spans = _operand_spans(a, b, out, c, staged)
        if max(spans.values()) <= select.INDEX_LIMIT:
            return cands
        fit = select.within_index_limit(cands, spans)
        if not fit:
            indexed = {name for cand in cands for name in select.layout_indexed(cand)}
            big = ", ".join(f"{name} spans {span} elements" for name, span in spans.items()
                            if span > select.INDEX_LIMIT and name in indexed)
            raise KernelNotFoundError(
                f"no cutlass-aot artifact in cache {self.cache.path} can serve this call of {sig}: "
                f"its variants address operands through 32-bit offsets, and {big} (more than "
                "2**31), so an offset would wrap. Split the call (e.g. along M), or open the cache "
                "with on_miss=\"torch\"",
                signature=str(sig), nearest=[], cache_dir=str(self.cache.path), spans=spans)
        return fit

    def choice_for(self, a, b, out=None, *, c=None, bias=None, act=None) -> select.Choice | None:
        """What a call with these arguments runs (for tools and benchmarks); None
        when it runs no artifact (K = 0, an empty problem, the torch fallback)."""
        out = self._new_out(a, b) if out is None else out
        key = (out.shape, out.stride(), out.dtype, a.stride(), b.stride(), a.shape[-1],
               None if c is None else c.stride(), bias if bias is None else bias.dtype,
               act, a.dtype)  # the entry's memo key
        self._memo.pop(key, None)
        self._resolve(key, a, b, out, c, bias, act)
        return self.last_choice.get(key)

    def _fallback(self, key, hit, a, b, out, c, bias, act, alpha, beta, exc):
        """The memoized artifact refused the call: resolve in full, retry once.

        Either another artifact serves these arguments (a layout or device
        the short key does not tell apart: the memo is pointed at it), or
        the arguments are bad and a specific ArgumentError says why, or the
        launch itself failed (a CUDA error) and a LaunchError says so.
        """
        for name, value in (("alpha", alpha), ("beta", beta if c is not None else 1.0)):
            if not isinstance(value, numbers.Real):
                raise _scalar_refusal(name, value) from exc
        self._memo.pop(key, None)
        fresh = self._resolve(key, a, b, out, c, bias, act)  # raises for bad signature/shape
        if _route(fresh) != _route(hit) and not isinstance(exc, RuntimeError):
            try:
                _launch(fresh, a, b, out, c, bias, alpha, beta)
                return out
            except (ValueError, TypeError, RuntimeError) as exc2:
                exc = exc2
        self._memo.pop(key, None)
        raise self._diagnose(a, b, out, c, bias, exc) from exc

    def _diagnose(self, a, b, out, c, bias, exc):
        """Name what is wrong with arguments an artifact refused, or the fault."""
        tensors = {"a": a, "b": b, "out": out} | ({} if c is None else {"c": c})
        for name, t in tensors.items():
            err = select.misalignment(name, t.data_ptr(), tuple(t.shape), tuple(t.stride()),
                                      t.element_size())
            if err is not None:
                return err
        if bias is not None and bias.stride(0) != 1:
            return ArgumentError(f"gemm: bias must be contiguous; got stride {bias.stride(0)}",
                                 tensor="bias")
        if isinstance(exc, RuntimeError):
            return LaunchError(
                f"gemm: the kernel launch failed: {exc}. This is a CUDA error, not a problem "
                "with the arguments (which passed every check); the CUDA context may be "
                "unusable after a fault: check `nvidia-smi`, and re-run with "
                "CUDA_LAUNCH_BLOCKING=1 to locate it", cuda_message=str(exc))
        return ArgumentError(f"gemm: the kernel refused these arguments: {exc}",
                             reason="artifact-check")


def _alias_spans(a, b, out, c, bias) -> tuple:
    """What the overlap filter keeps per memo key: (out's extent, b's extent,
    a's sizes less one or None, a's element size, out's sizes less one, c's
    element size, the bias's extent), in bytes; 0 and None for empty
    tensors, which share no byte (an empty out skips the filter).

    Resolve keeps them from a call whose shapes it checked. The key holds
    out's shape and strides, b's strides, K, whether there is a c, and the
    bias's dtype; a's and c's strides are read per call. A later call of the
    same key whose a, b or c has another shape, whose c or bias has another
    dtype, or whose bias is not a contiguous vector of length N, is refused
    by the artifact's compiled checks before anything launches (a torch
    fallback raises on such a mismatch, or broadcasts a smaller c or bias,
    whose bytes these extents cover), so they need only hold for the calls
    that launch. Reading each operand's own shape instead cost the filter
    up to 0.6 µs more a call on the build machine (with a bias, or out is c:
    0.98-1.13 µs against 0.43-0.51)."""
    if 0 in out.shape:
        return (0, 0, None, 0, (), 0, 0)
    n = out.shape[-1]
    extent = select.byte_extent
    return (extent(out.shape, out.stride(), out.element_size()),
            0 if 0 in b.shape else extent(b.shape, b.stride(), b.element_size()),
            None if 0 in a.shape else tuple(x - 1 for x in a.shape), a.element_size(),
            tuple(x - 1 for x in out.shape), 0 if c is None else c.element_size(),
            0 if bias is None else n * bias.element_size())


def _may_alias(spans: tuple, a, b, out, c, bias) -> bool:
    """Whether an operand's byte range meets out's: pointer compares, and an
    operand's strides only where its first byte lies below out's end."""
    ext_out, ext_b, a_steps, a_item, out_steps, c_item, ext_bias = spans
    if not ext_out:
        return False  # an empty out writes nothing
    po, pb, p = out.data_ptr(), b.data_ptr(), a.data_ptr()
    pc = c.data_ptr() if c is not None and c is not out else po
    pbias = bias.data_ptr() if bias is not None else po
    # every pointer read before any return: a null one is refused (not an
    # empty operand's, K = 0's), whatever overlaps
    if not (po and pb and p and pc and pbias) \
            and any(_no_storage(t) for t in (a, b, out, c, bias) if t is not None):
        raise _storage_refusal(a=a, b=b, out=out, c=c, bias=bias)
    end = po + ext_out
    if pb < end and po < pb + ext_b:
        return True
    if p < end and a_steps is not None:
        last = 0
        for n, s in zip(a_steps, a.stride()):
            last += n * s
        if po < p + (last + 1) * a_item:
            return True
    if c is not None and c is not out:
        p = pc
        if p < end:
            last = 0
            for n, s in zip(out_steps, c.stride()):
                last += n * s
            if po < p + (last + 1) * c_item:
                return True
    if bias is not None:
        p = pbias
        if p < end and po < p + ext_bias:
            return True
    return False


def _view(t) -> tuple | None:
    return None if t is None else (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size())


def _check_alias(a, b, out, c, bias) -> None:
    """select.check_no_alias on the call's tensors (the exact check)."""
    select.check_no_alias(_view(out), {"a": _view(a), "b": _view(b), "c": _view(c),
                                       "bias": _view(bias)})


def _route(hit) -> tuple:
    """What a memo entry runs: its artifact (or torch launcher) and whether it stages."""
    return hit[0], getattr(hit[2], "staged", False)


def _launch(hit, a, b, out, c, bias, alpha, beta) -> None:
    fn, sms, launch = hit
    if launch is not None:
        launch(a, b, out, c, bias, alpha, beta)
    elif c is None:
        fn(a, b, out, alpha, sms)
    else:
        fn(a, b, out, c, alpha, beta, sms)


def _split_k_launcher(fn, sms: int, choice: select.Choice, m: int, n: int, batch: int, *,
                      k: int = 0):
    """A launch closure that hands a split-K artifact its scratch and split count.

    The scratch comes from torch's caching allocator on the current stream
    (under CUDA graph capture, from the graph's private pool), so several
    streams, threads and graph replays never share it. Split count 0 is
    stream-K, whose scratch depends on K too.
    """
    cand, splits = choice.candidate, choice.splits
    if splits == 0 and k < 1:
        raise ValueError(f"{choice.label()}: stream-K needs the call's K to size its scratch")
    elems = splitk_workspace_elems(m, n, batch, splits, tile_m=cand.tile_m, tile_n=cand.tile_n,
                                   cluster_m=cand.cluster_m, cluster_n=cand.cluster_n,
                                   swap_ab=cand.swap_ab, sm_count=sms, k=k)
    empty, f32 = torch.empty, torch.float32

    def launch(a, b, out, c, bias, alpha, beta):
        ws = empty(elems, dtype=f32, device=out.device)
        args = [a, b, out]
        if c is not None:
            args.append(c)
        if bias is not None:
            args.append(bias)
        args += [ws, alpha]
        if c is not None:
            args.append(beta)
        fn(*args, splits, sms)

    launch.split_k = (splits, elems)  # what the C++ entry needs to launch it alone
    return launch


# The split count the C++ entry takes for the plain ABI (a, b, out, alpha,
# sms). Any count >= 0 is the split-K ABI's, 0 its stream-K schedule. Until
# r24 the plain ABI was 0 there: every eager stream-K call reached the
# artifact with the plain argument list, was refused, and ran from the
# Python path after the exception (r24's decode: 83 µs eager against 55
# under graph replay at 64x10240x8192).
PLAIN_ABI = -1


def _fast_registration(hit: tuple) -> tuple | None:
    """What the C++ entry registers for memo entry ``hit``: (artifact, SM
    count, splits, split-K scratch elements), or None for an entry it cannot
    launch alone (staged, torch: their launchers carry neither ``split_k``
    nor ``bias_abi``). A call's c and bias, if any, go after ``out`` (c
    first) either way: the C++ entry inserts the call's own tensors there."""
    fn, sms, launch = hit
    if fn is None:
        return None
    if launch is None or getattr(launch, "bias_abi", False):
        return (fn, sms, PLAIN_ABI, 0)
    split_k = getattr(launch, "split_k", None)
    return None if split_k is None else (fn, sms, *split_k)


def _memo_entry(cache: Cache, choice: select.Choice, sms: int, m: int, n: int, batch: int,
                with_bias: bool, *, k: int = 0, device: int | None = None,
                grid_sms: int | None = None, odd_edge: bool = False) -> tuple:
    """The memo entry that launches ``choice``: (artifact, SM count, launcher or None).

    The SM count it hands the artifact is ``occupancy.grid_sms``: for a
    cluster of 4 CTAs, the resident clusters times 4, not the device's SMs
    (the persistent grid would otherwise hold clusters that wait for a whole
    walk to end). ``grid_sms`` overrides it (a benchmark comparing grids).
    ``odd_edge``: out's contiguous extent is off a 16-byte boundary
    (pitch.odd_edge); a variant that stores whole chunks then writes out
    through scratch (``_stages_out``), so nothing past the edge changes."""
    stage_out = odd_edge and _stages_out(cache, choice)
    fn = cache.function(choice.candidate.key)
    if grid_sms is None:
        if device is None:
            device = torch.cuda.current_device()
        grid_sms = occupancy.grid_sms(device, choice.candidate.cluster_size, sms)
    sms = grid_sms
    if choice.candidate.split_k:
        hit = (fn, sms, _split_k_launcher(fn, sms, choice, m, n, batch, k=k))
    elif with_bias:
        hit = (fn, sms, _bias_launcher(fn, sms))
    else:
        hit = (fn, sms, None)  # the common case: no closure between call and artifact
    if choice.staged or stage_out:
        hit = (fn, sms, _staged_launcher(hit, stage_out))
    return hit


def _stages_out(cache: Cache, choice: select.Choice) -> bool:
    """Whether ``choice``'s family stores whole 16-byte chunks (pitch.stores_whole_chunks):
    an out with an odd edge must then be written through scratch."""
    entry = cache.entries.get(choice.candidate.key)
    return entry is None or pitch.stores_whole_chunks(str(entry.record.get("family")))


def launch_choice(cache: Cache, choice: select.Choice, sms: int, m: int, n: int, batch: int,
                  bias=None, *, k: int = 0, grid_sms: int | None = None):
    """``f(a, b, out)`` launching one chosen variant as dispatch would (tune, benchmarks);
    ``f(a, b, out, c)`` adds ``c`` with beta 1 (a residual: a with-C variant takes
    nothing else). ``bias``: the vector a variant with a bias epilogue adds (its
    activation is built in); ``k``: the problem's K (a stream-K choice sizes its
    scratch by it); ``grid_sms``: the SM count handed to the artifact, in place of
    ``occupancy.grid_sms``'s (benchmarks/cluster_grid_probe.py compares the two)."""
    hit = _memo_entry(cache, choice, sms, m, n, batch, bias is not None, k=k, grid_sms=grid_sms)
    return lambda a, b, out, c=None: _launch(hit, a, b, out, c, bias, 1.0, 1.0)


def _bias_launcher(fn, sms: int):
    """A launch closure for a variant with a bias (signature.gemm_abi_args order)."""

    def launch(a, b, out, c, bias, alpha, beta):
        if c is None:
            fn(a, b, out, bias, alpha, sms)
        else:
            fn(a, b, out, c, bias, alpha, beta, sms)

    launch.bias_abi = True  # the C++ entry may launch it alone (with or without c)
    return launch


def _staged_launcher(inner: tuple, stage_out: bool = False):
    """A launch closure serving a call below 16-byte alignment with a 16-byte variant.

    Per call, each of A, B and C that is not 16-byte aligned (pointer or a
    stride) is copied into a 16-byte pitched tensor of its layout; if out is
    not, or ``stage_out`` (its edge is off a 16-byte boundary and the
    variant stores whole chunks: run/pitch.py ``odd_edge``), the variant
    writes a pitched tensor that is then copied into out (run/pitch.py: the
    layout and the check).
    Scratch comes from torch's caching allocator on the current stream
    (captured CUDA graphs use their pool). The cost is one read and one write
    of each misaligned operand plus a copy kernel's launch (bench_unaligned.py
    measures it against the low-alignment family and cuBLAS). A call that
    turns out aligned (same dispatch key, aligned pointers) passes straight
    through.
    """
    staged, aligned16 = pitch.pitched_like, pitch.aligned16

    def launch(a, b, out, c, bias, alpha, beta):
        if not aligned16(a):
            a = staged(a).copy_(a)
        if not aligned16(b):
            b = staged(b).copy_(b)
        if c is not None and not aligned16(c):
            c = staged(c).copy_(c)
        dest = out if not stage_out and aligned16(out) else staged(out)
        _launch(inner, a, b, dest, c, bias, alpha, beta)
        if dest is not out:
            out.copy_(dest)

    launch.staged = True
    return launch


def _operand_spans(a, b, out, c, staged: bool = False) -> dict[str, int]:
    """Each given operand's extent in elements (select.element_span), by the
    names select.within_index_limit reads. ``staged``: as the staged route
    launches them (``_staged_launcher``): an operand below 16-byte alignment
    is a copy with rows padded to 16 bytes (pitch.pitched_strides), which can
    span more elements than the caller's tensor."""
    spans = {}
    for name, t in (("a", a), ("b", b), ("out", out), ("c", c)):
        if t is None:
            continue
        shape, strides = tuple(t.shape), tuple(t.stride())
        if staged and not pitch.aligned16(t):
            strides = pitch.pitched_strides(shape, strides, t.element_size())
        spans[name] = select.element_span(shape, strides)
    return spans


def _forward_ad_level() -> int:
    """The open forward-AD level (-1: none), as ops.forward_ad_active reads it."""
    return _forward_ad._current_level


def _autograd_refusal() -> ArgumentError:
    """The error for a call autograd would differentiate (grad mode on and a
    tensor that requires grad) or a forward-AD level would need a tangent of."""
    return ArgumentError(
        "gemm writes its output without recording an autograd graph, so a call with grad mode on and "
        "an operand (or out) that requires grad, or under an open forward-AD level, is refused (as "
        "torch.mm(..., out=) refuses it): call it under torch.no_grad() or torch.inference_mode(), "
        "detach the operands, or compute this product with torch where you need its gradient "
        "(cutlass_aot.nn.Linear does that itself)", reason="autograd")


def _neg_refusal(**tensors) -> ArgumentError:
    """The error for a negative-bit view among ``tensors`` (None: not given),
    whose memory holds the values unnegated: the kernel would read them so."""
    name = next(n for n, t in tensors.items() if t is not None and t.is_neg())
    return ArgumentError(f"gemm: {name} is a negative-bit view, whose memory holds the values "
                         f"unnegated: pass {name}.resolve_neg()", tensor=name, reason="neg-view")


def _version_bump():
    """``torch._C._increment_version`` taking a tuple of tensors. torch 2.5
    made it take a tensor or an iterable (a bare tensor is then iterated, row
    by row); torch 2.4's takes one tensor and refuses a tuple."""
    bump = torch._C._increment_version
    try:
        bump((torch.empty(0),))
    except (RuntimeError, TypeError):
        return lambda tensors: bump(tensors[0])
    return bump


def _no_storage(t) -> bool:
    """Whether the kernel would read address 0 for ``t``: a non-empty tensor
    whose data pointer is null or cannot be read."""
    try:
        return not t.data_ptr() and t.numel() > 0
    except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
        return True


def _storage_refusal(**tensors) -> ArgumentError:
    """The error for a tensor among ``tensors`` (None: not given) with no
    storage of its own: DLPack hands the kernel a null pointer for it."""
    name, t = next(((n, t) for n, t in tensors.items() if t is not None and _no_storage(t)),
                   ("a", tensors.get("a")))
    return ArgumentError(
        f"gemm: {name} is a {type(t).__name__} with no storage of its own (a fake, zero or "
        "wrapper tensor such as DTensor, or a vmap-batched one), so the kernel would read "
        f"address 0: pass a materialized tensor ({name}.full_tensor() or {name}.to_local() for a "
        "DTensor, .clone() for a zero tensor), or compute this product with torch",
        tensor=name, reason="no-storage")


def _scalar_refusal(name: str, value) -> ArgumentError:
    return ArgumentError(f"gemm: {name} must be a real number (int or float); got "
                         f"{type(value).__name__} {value!r:.60}", **{name: repr(value)[:60]})


def _operands(a, b, c, bias) -> tuple:
    """What a launcher with no compiled checks must see again before it serves
    a call under a memo key: the key leaves out A's shape, B's and C's dtype,
    layout and device (an artifact's compiled checks enforce those), and
    torch would broadcast a mismatched A, C or bias rather than refuse it."""
    return (tuple(a.shape), tuple(b.shape), a.dtype, b.dtype, a.device, b.device,
            a.stride()[-1] == 1,
            None if c is None else (tuple(c.shape), c.dtype, c.device, c.stride()[-1] == 1),
            None if bias is None else (tuple(bias.shape), bias.dtype, bias.device))


def _torch_launcher(slot, act, a, b, c, bias):
    """on_miss="torch": run a call no artifact serves through torch, and count it.

    It checks what the dispatch key leaves out (``_operands``) on every call,
    so a call that merely shares the key is resolved in full (the ValueError
    sends it there: a bad one raises ArgumentError) rather than served, and
    broadcast, as the first one was.
    """
    expect = _operands(a, b, c, bias)

    def launch(a, b, out, c, bias, alpha, beta):
        if out.device != expect[4] or _operands(a, b, c, bias) != expect:
            raise ValueError("operands differ from the call this torch fallback was resolved for")
        slot.fallbacks += 1
        torch_gemm(a, b, out, c, bias, act, alpha, beta)

    return launch


def _heterogeneous() -> bool:
    """Whether visible GPUs differ in arch or SM count (then the key needs the device)."""
    infos = {device_info(i)[:2] for i in range(torch.cuda.device_count())}
    return len(infos) > 1


def _empty_problem(a, b, out, c, bias, alpha, beta) -> None:
    """M, N or L is zero: there is nothing to compute or write."""
    return None


_ACT_FNS = {
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "gelu_erf": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


def _k_zero_launcher(sig: Signature, a, b, c, bias):
    """K is zero: D = act(beta * C + bias), or act(bias), or zeros (as torch.mm gives).

    No artifact runs, so nothing else checks a later call under the same
    memo key: it must match this one (``_operands``), or be resolved in full."""
    fields = dict(sig.fields)
    act = _ACT_FNS.get(str(fields.get("act", "none")))
    expect = _operands(a, b, c, bias)

    def launch(a, b, out, c, bias, alpha, beta):
        if out.device != expect[4] or _operands(a, b, c, bias) != expect:
            raise ValueError("operands differ from the call this K = 0 launch was resolved for")
        val = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        if c is not None and beta:
            val += beta * c.float()
        if bias is not None:
            val += bias.float()
        out.copy_(act(val) if act is not None else val)

    return launch
