"""GPU tests of the torch integration (runs on the device machine).

Self-contained (no conftest): `pytest --noconftest tests/gpu/test_torch_integration_gpu.py`
with a built cache in CUTLASS_AOT_CACHE_DIR. Covers:

* torch.ops.cutlass_aot.gemm (and gemm_out, the out= form compiled
  nn.Linear calls): opcheck, results, torch.compile(fullgraph=True)
  with no graph break, mode="reduce-overhead" (CUDA graph replays), no
  backward (a clear error; nn.Linear trains through F.linear);
* the fallback policy: on_miss="torch" gives torch's result and is counted,
  on_miss="raise" raises, bad arguments raise under either policy;
* Cache.stats() and the shape log on real calls;
* cutlass_aot.nn.Linear and patch() against nn.Linear, eager and compiled;
* every bias/act epilogue x dtype x majorness the cache has entries for
  (skipped, with the reason, when the cache has none).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_aot
from cutlass_aot import shapelog
from cutlass_aot.errors import ArgumentError, KernelNotFoundError
from cutlass_aot.nn import Linear, patch
from cutlass_aot.run import ops
from cutlass_aot.run.fallback import torch_gemm
from cutlass_aot.run.servable import gemm_signature, normalized, serves, serving_index

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
NAMES = {v: k for k, v in TORCH.items()}
# Relative Frobenius error bounds against a float64 reference (fp32 accumulate).
TOL = {"f16": 4e-3, "bf16": 2e-2, "f32": 1e-4}


@pytest.fixture(scope="module")
def path():
    value = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not value:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    return value


@pytest.fixture(scope="module")
def cache(path):
    return cutlass_aot.open_cache(path)


def _arch() -> str:
    from cutlass_aot.signature import ARCH_BY_CAPABILITY  # noqa: PLC0415

    cap = torch.cuda.get_device_capability()
    return ARCH_BY_CAPABILITY.get(cap, f"sm_{cap[0]}{cap[1]}")


def _linear_dtype(cache, bias: bool = False) -> torch.dtype:
    """A 16-bit dtype whose plain nn.Linear signature (x @ w.t()) the cache serves."""
    index = serving_index(cache.by_signature)
    for name in ("bf16", "f16"):
        if serves(index, gemm_signature(_arch(), a=name, bias=name if bias else None)):
            return TORCH[name]
    pytest.skip(f"the cache serves no {'bias ' if bias else ''}x @ w.t() signature for {_arch()}")


def rel_err(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(a, b, c=None, bias=None, act="none", alpha=1.0, beta=1.0):
    acc = alpha * (a.double() @ b.double())
    if c is not None:
        acc = acc + beta * c.double()
    if bias is not None:
        acc = acc + bias.double()
    return {"none": lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu_erf": F.gelu,
            "gelu": lambda x: F.gelu(x, approximate="tanh")}[act](acc)


# ------------------------------------------------------------ the custom op
def test_op_opcheck(cache, path):
    dt = _linear_dtype(cache)
    a = torch.randn(200, 256, device="cuda", dtype=dt)
    w = torch.randn(136, 256, device="cuda", dtype=dt)
    result = torch.library.opcheck(ops.gemm, (a, w.t()), {"cache": path})
    assert set(result.values()) == {"SUCCESS"}, result


def test_op_result_and_dtype(cache, path):
    dt = _linear_dtype(cache)
    a = torch.randn(129, 512, device="cuda", dtype=dt)
    w = torch.randn(264, 512, device="cuda", dtype=dt)
    y = torch.ops.cutlass_aot.gemm(a, w.t(), alpha=0.5, cache=path)
    assert y.shape == (129, 264) and y.dtype == dt and y.is_contiguous()
    assert rel_err(y, reference(a, w.t(), alpha=0.5)) < TOL[NAMES[dt]]


def test_op_compiles_fullgraph_without_graph_breaks(cache, path):
    dt = _linear_dtype(cache)
    w1 = torch.randn(512, 256, device="cuda", dtype=dt) / 16
    w2 = torch.randn(256, 512, device="cuda", dtype=dt) / 16

    def f(x):
        h = torch.ops.cutlass_aot.gemm(x, w1.t(), cache=path)
        return torch.ops.cutlass_aot.gemm(torch.relu(h), w2.t(), cache=path) + x

    x = torch.randn(64, 256, device="cuda", dtype=dt)
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    for m in (64, 300):
        x = torch.randn(m, 256, device="cuda", dtype=dt)
        y = compiled(x)
        ref = reference(torch.relu(reference(x, w1.t())).to(dt), w2.t()) + x.double()
        assert rel_err(y, ref) < 2 * TOL[NAMES[dt]]


def test_op_reduce_overhead_replays_cuda_graphs(cache, path):
    from torch._dynamo.utils import counters  # noqa: PLC0415

    dt = _linear_dtype(cache)
    w = torch.randn(384, 256, device="cuda", dtype=dt) / 16

    def f(x):
        return torch.ops.cutlass_aot.gemm(x, w.t(), cache=path) * 2

    counters.clear()
    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for step in range(6):  # warm-up, record, then replays
        x = torch.randn(128, 256, device="cuda", dtype=dt)
        y = compiled(x)
        assert rel_err(y, 2 * reference(x, w.t())) < TOL[NAMES[dt]], f"step {step}"
        y = y.clone()  # cudagraph outputs are overwritten by the next replay
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_gemm_out_matches_gemm_and_compiled_linear_uses_planned_buffers(cache, path):
    """The out= op writes what the functional op returns; a compiled patched
    model calls it into Inductor buffers (reused, no copies) and replays in
    CUDA graphs with no skips."""
    from torch._dynamo.utils import counters  # noqa: PLC0415
    from torch._inductor.utils import run_and_get_code  # noqa: PLC0415

    dt = _linear_dtype(cache)
    a = torch.randn(129, 512, device="cuda", dtype=dt)
    w = torch.randn(264, 512, device="cuda", dtype=dt)
    out = torch.full((129, 264), float("nan"), device="cuda", dtype=dt)
    with torch.no_grad():
        assert torch.ops.cutlass_aot.gemm_out(a, w.t(), out, alpha=0.5, cache=path) is None
        assert torch.equal(out, torch.ops.cutlass_aot.gemm(a, w.t(), alpha=0.5, cache=path))
        with pytest.raises(ArgumentError, match="out must have the output's shape"):
            torch.ops.cutlass_aot.gemm_out(a, w.t(), out[:, :8], cache=path)
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(4)]).to("cuda", dt)
    model = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(4)]).to("cuda", dt)
    model.load_state_dict(ref.state_dict())
    assert len(patch(model, cache).swapped) == 4
    x = torch.randn(64, 256, device="cuda", dtype=dt)
    with torch.no_grad():
        want = ref(x).double()
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True):  # so the code is generated
            got, codes = run_and_get_code(torch.compile(model, fullgraph=True), x)
        assert rel_err(got, want) < 2 * TOL[NAMES[dt]]
        call = codes[0][codes[0].index("def call("):]
        assert call.count("torch.ops.cutlass_aot.gemm_out.default(") == 4, call
        assert "# reuse" in call and "clone" not in call and "copy_" not in call, call
        counters.clear()
        torch._dynamo.reset()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for step in range(6):  # warm-up, record, then replays
            x = torch.randn(64, 256, device="cuda", dtype=dt)
            y = compiled(x).clone()
            assert rel_err(y, ref(x).double()) < 2 * TOL[NAMES[dt]], f"step {step}"
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_op_has_no_backward_and_linear_trains_through_torch(cache, path):
    dt = _linear_dtype(cache)
    x = torch.randn(64, 128, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(96, 128, device="cuda", dtype=dt, requires_grad=True)
    with pytest.raises(ArgumentError, match="no backward"):
        torch.ops.cutlass_aot.gemm(x, w.t(), cache=path)
    with torch.no_grad():
        y = torch.ops.cutlass_aot.gemm(x, w.t(), cache=path)
    assert rel_err(y, reference(x.detach(), w.detach().t())) < TOL[NAMES[dt]]
    lin = Linear(128, 96, bias=False, cache=cache, device="cuda", dtype=dt)
    lin.weight.data.copy_(w.detach())
    g = torch.randn(64, 96, device="cuda", dtype=dt)
    lin(x).backward(g)  # grad mode on: F.linear, torch's gradients
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (xr @ wr.t()).backward(g.double())
    assert rel_err(x.grad, xr.grad) < TOL[NAMES[dt]] and rel_err(lin.weight.grad, wr.grad) < TOL[NAMES[dt]]


# ------------------------------------------------------------ fallback policy
def _missing_signature(cache, bias=None, act="none"):
    """(dtype, a_major, rank) of an aligned call (f32 column-major out) the cache does not serve.

    Not served at any alignment or arch dispatch would try (select.signature_order).
    """
    from cutlass_aot.archs import runnable_archs  # noqa: PLC0415
    from cutlass_aot.run.select import signature_order  # noqa: PLC0415

    index = serving_index(cache.by_signature)
    for name in ("f16", "bf16"):
        for a_major in ("m", "k"):
            for rank in (3, 2):
                sig = gemm_signature(_arch(), a=name, d="f32", a_major=a_major, b_major="n",
                                     d_major="m", rank=rank, bias=bias, act=act)
                if not any(serves(index, s) for s in signature_order(sig, 16, runnable_archs(_arch()))):
                    return TORCH[name], a_major, rank
    pytest.skip("the cache serves every candidate signature; no miss to test")


def _operands(dt, a_major, rank, m=100, n=72, k=64):
    batch = (3,) if rank == 3 else ()
    a = torch.randn(*batch, m, k, device="cuda", dtype=dt)
    if a_major == "m":
        a = torch.randn(*batch, k, m, device="cuda", dtype=dt).transpose(-1, -2)
    b = torch.randn(*batch, k, n, device="cuda", dtype=dt)
    out = torch.empty(*batch, n, m, device="cuda", dtype=torch.float32).transpose(-1, -2)
    return a, b, out


def test_on_miss_torch_falls_back_counts_and_logs(path, tmp_path, monkeypatch):
    log = tmp_path / "shapes.jsonl"
    monkeypatch.setenv("CUTLASS_AOT_SHAPE_LOG", str(log))
    shapelog.forget_logged()
    cache = cutlass_aot.open_cache(path, on_miss="torch")
    dt, a_major, rank = _missing_signature(cache, bias="f32", act="silu")
    a, b, out = _operands(dt, a_major, rank)
    bias = torch.randn(out.shape[-1], device="cuda", dtype=torch.float32)
    before = cache.stats()["totals"]["fallbacks"]
    got = cache.gemm(a, b, out, bias=bias, act="silu", alpha=0.5)
    assert got is out
    assert rel_err(out, reference(a, b, bias=bias, act="silu", alpha=0.5)) < 1e-2
    # The same torch computation into an out of the same dtype (f32): equal up to rounding.
    assert rel_err(out, torch_gemm(a, b, torch.empty_like(out), bias=bias, act="silu",
                                   alpha=0.5).float()) < 1e-6
    cache.gemm(a, b, out, bias=bias, act="silu", alpha=0.5)
    assert cache.stats()["totals"]["fallbacks"] == before + 2
    records, skipped = shapelog.read_shape_log(log)
    assert skipped == 0 and [r.outcome for r in records] == ["fallback"]  # once per process
    assert records[0].shape == (a.shape[-2], b.shape[-1], a.shape[-1], a.shape[0] if rank == 3 else 1)
    shapelog.forget_logged()


def test_on_miss_raise_and_bad_arguments_under_either_policy(path):
    strict = cutlass_aot.open_cache(path, on_miss="raise")
    lenient = cutlass_aot.open_cache(path, on_miss="torch")
    dt, a_major, rank = _missing_signature(strict)
    a, b, out = _operands(dt, a_major, rank)
    misses = strict.stats()["totals"]["misses"]
    with pytest.raises(KernelNotFoundError):
        strict.gemm(a, b, out)
    assert strict.stats()["totals"]["misses"] == misses + 1
    for cache in (strict, lenient):
        with pytest.raises(ArgumentError):
            cache.gemm(a.cpu(), b.cpu(), out.cpu())                 # CPU tensors
        with pytest.raises(ArgumentError):
            cache.gemm(a, b[..., :-8, :], out)                       # K mismatch
        with pytest.raises(ArgumentError):
            cache.gemm(a, b, out, bias=torch.zeros(5, device="cuda"))  # bias length
        with pytest.raises(ArgumentError):
            cache.gemm(a, b, out, act="tanh")                        # unknown act


def test_the_fallback_product_stays_fp32_on_the_gpu():
    """torch_gemm's fp32 product (cuBLAS with out_dtype where torch has it, else
    widened inputs): into an fp32 out, a bf16 GEMM matches float64 to fp32
    accumulation, far inside what a bf16-rounded product would miss by."""
    for dt in (torch.bfloat16, torch.float16):
        for rank in (2, 3):
            batch = (3,) if rank == 3 else ()
            a = torch.randn(*batch, 64, 256, device="cuda", dtype=dt)
            b = torch.randn(*batch, 256, 128, device="cuda", dtype=dt)
            out = torch.full((*batch, 64, 128), float("nan"), device="cuda", dtype=torch.float32)
            torch_gemm(a, b, out)
            assert torch.isfinite(out).all()
            assert rel_err(out, a.double() @ b.double()) < 1e-5, (dt, rank)


def test_a_memoized_fallback_refuses_what_a_fresh_call_refuses(path):
    """The memo key leaves out A's shape and C's: a torch fallback memoized for
    one call once served a 1-row A, or a C of shape [N], under the same key,
    broadcasting them into a wrong result. Such calls now raise as a fresh
    one does, and a matching call still falls back."""
    cache = cutlass_aot.open_cache(path, on_miss="torch")
    dt, a_major, rank = _missing_signature(cache)
    a, b, out = _operands(dt, a_major, rank)
    c = torch.randn_like(out)  # out's dtype and layout (column-major), as gemm requires
    cache.gemm(a, b, out, c=c)  # resolved and memoized
    with pytest.raises(ArgumentError):
        cache.gemm(a[..., :1, :], b, out, c=c)
    with pytest.raises(ArgumentError):
        cache.gemm(a, b, out, c=c[..., :1, :])
    out.fill_(float("nan"))
    cache.gemm(a, b, out, c=c)
    assert rel_err(out, reference(a, b) + c.double()) < 1e-2


def test_a_memoized_k_zero_call_refuses_what_a_fresh_call_refuses(path):
    """K = 0 runs no artifact, so nothing checked later calls under its memo key."""
    cache = cutlass_aot.open_cache(path)
    a = torch.empty(4, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(0, 8, device="cuda", dtype=torch.bfloat16)
    out = torch.full((4, 8), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = torch.ones(4, 8, device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, b, out, c=c)
    assert torch.equal(out, c)
    for bad_a, bad_c in [(torch.empty(7, 0, device="cuda", dtype=torch.bfloat16), c),
                         (a, torch.arange(8, device="cuda", dtype=torch.bfloat16)),
                         (torch.empty(4, 0, device="cuda"), c)]:
        with pytest.raises(ArgumentError):
            cache.gemm(bad_a, b, out, c=bad_c)
    cache.gemm(a, b, out, c=2 * c)
    assert (out == 2).all()


def test_misaligned_call_with_only_aligned_variants_is_staged_not_a_fallback(path):
    """Batched GEMMs have aligned variants but no low-alignment ones: an A that
    starts 2 bytes off is served by them staged under either policy, counted
    as a staged hit, never a fallback. (Until this round: an ArgumentError
    under on_miss="raise", a torch fallback under on_miss="torch".)"""
    for policy in ("raise", "torch"):
        cache = cutlass_aot.open_cache(path, on_miss=policy)
        sig = gemm_signature(_arch(), a="bf16", b_major="n", rank=3)
        if sig not in cache.by_signature:
            pytest.skip("needs aligned batched bf16 variants")
        base = torch.randn(3 * 100 * 64 + 1, device="cuda", dtype=torch.bfloat16)
        a = base[1:].view(3, 100, 64)  # data pointer 2 bytes past alignment
        b = torch.randn(3, 64, 72, device="cuda", dtype=torch.bfloat16)
        before = cache.stats()["totals"]
        out = torch.full((3, 100, 72), float("nan"), device="cuda", dtype=torch.bfloat16)
        cache.gemm(a, b, out)
        torch.cuda.synchronize()
        assert rel_err(out, reference(a, b)) < TOL["bf16"]
        after = cache.stats()["totals"]
        assert after["staged"] == before["staged"] + 1 and after["fallbacks"] == before["fallbacks"]


def test_stats_count_hits(path):
    """Hits are counted when a dispatch key is resolved (its first call), not per call."""
    cache = cutlass_aot.open_cache(path)
    dt = _linear_dtype(cache)
    a = torch.randn(77, 128, device="cuda", dtype=dt)
    w = torch.randn(64, 128, device="cuda", dtype=dt)
    before = cache.stats()["totals"]["hits"]
    for _ in range(5):
        cache.gemm(a, w.t())
    assert cache.stats()["totals"]["hits"] == before + 1
    cache.gemm(a[:70], w.t())  # a new output shape: a new key
    snap = cache.stats()
    assert snap["totals"]["hits"] == before + 2
    assert any(b["m_le"] == 128 and b["n"] == 64 and b["k"] == 128
               for s in snap["signatures"].values() for b in s["buckets"])


# ------------------------------------------------------------ nn.Linear and patch
class Block(nn.Module):
    def __init__(self, width, hidden, bias):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ffn = nn.Sequential(nn.Linear(width, hidden, bias=bias), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, width, bias=bias))
        self.odd = nn.Linear(width, 60, bias=False)  # 120-byte rows: served staged

    def forward(self, x):
        return x + self.ffn(self.norm(x)), self.odd(x)


@pytest.mark.parametrize("bias", [False, True])
def test_patch_matches_nn_linear_eager_and_compiled(cache, path, bias):
    dt = _linear_dtype(cache, bias=bias)
    torch.manual_seed(0)
    ref_model = Block(512, 1024, bias).to("cuda", dt)
    model = Block(512, 1024, bias).to("cuda", dt)
    model.load_state_dict(ref_model.state_dict())
    report = patch(model, cache)
    swapped = {s["name"] for s in report.swapped}
    assert {"ffn.0", "ffn.2"} <= swapped, str(report)
    # N = 60 (120-byte rows): the 16-byte variants serve it, out staged.
    assert "staged" in next(s for s in report.swapped if s["name"] == "odd"), str(report)
    x = torch.randn(4, 33, 512, device="cuda", dtype=dt)
    with torch.no_grad():
        want, want_odd = ref_model(x)
        got, got_odd = model(x)
        assert rel_err(got, want.double()) < TOL[NAMES[dt]]
        assert rel_err(got_odd, want_odd.double()) < TOL[NAMES[dt]]
        compiled = torch.compile(model, fullgraph=True)
        got_c, _ = compiled(x)
        assert rel_err(got_c, want.double()) < TOL[NAMES[dt]]
        assert torch._dynamo.explain(model)(x).graph_break_count == 0
    # state dicts stay interchangeable
    assert model.state_dict().keys() == ref_model.state_dict().keys()
    ref_model.load_state_dict(model.state_dict())


def test_linear_module_direct(cache, path):
    dt = _linear_dtype(cache)
    lin = Linear(256, 128, bias=False, cache=cache, device="cuda", dtype=dt)
    x = torch.randn(3, 5, 256, device="cuda", dtype=dt)
    with torch.no_grad():
        y = lin(x)
        assert y.shape == (3, 5, 128)
        assert rel_err(y, F.linear(x.double(), lin.weight.double())) < TOL[NAMES[dt]]
        # fp32 input under autocast runs through F.linear, as nn.Linear's would
        with torch.autocast("cuda", dtype=dt):
            assert lin(x.float()).dtype == dt


def test_linear_takes_a_transposed_or_strided_input(cache, path):
    """r50 review: a 2-D x that is not row-major (x.t() of a [K, M] tensor,
    x[:, ::2]) reached the row-major signature patch() had checked, and raised
    (KernelNotFoundError for a_major=m, ArgumentError for stride 2) where
    nn.Linear computes it. Poisoned outputs are not possible here (the module
    allocates), so the check is the float64 reference."""
    dt = _linear_dtype(cache)
    lin = Linear(256, 136, bias=False, cache=cache, device="cuda", dtype=dt)
    with torch.no_grad():
        for x in (torch.randn(256, 77, device="cuda", dtype=dt).t(),
                  torch.randn(77, 512, device="cuda", dtype=dt)[:, ::2]):
            y = lin(x)
            assert y.shape == (77, 136)
            assert rel_err(y, F.linear(x.double(), lin.weight.double())) < TOL[NAMES[dt]]
        x3 = torch.randn(3, 5, 512, device="cuda", dtype=dt)[..., ::2]  # reshape keeps stride 2
        assert rel_err(lin(x3), F.linear(x3.double(), lin.weight.double())) < TOL[NAMES[dt]]


def test_the_entry_refuses_autograd_after_a_memoized_call(cache, path):
    """r50 review, on the real artifacts and the C++ entry: after a plain call
    has memoized its layout, the same layout with an out (or a) that requires
    grad is refused, not written behind autograd's back; alpha=None names
    alpha (it said "the kernel refused these arguments")."""
    dt = _linear_dtype(cache)
    gemm = cache.gemm
    a = torch.randn(64, 256, device="cuda", dtype=dt)
    w = torch.randn(136, 256, device="cuda", dtype=dt)
    out = torch.full((64, 136), float("nan"), device="cuda", dtype=dt)
    gemm(a, w.t(), out)
    gemm(a, w.t(), out)  # memoized (and registered with the C++ entry where it is built)
    assert rel_err(out, a.double() @ w.double().t()) < TOL[NAMES[dt]]
    y = torch.sigmoid(torch.randn(64, 136, device="cuda", dtype=dt, requires_grad=True))
    before = y.detach().clone()
    with pytest.raises(cutlass_aot.ArgumentError, match="no_grad"):
        gemm(a, w.t(), y)
    assert torch.equal(y.detach(), before), "nothing written"
    with pytest.raises(cutlass_aot.ArgumentError, match="no_grad"):
        gemm(a.clone().requires_grad_(), w.t(), out)
    with torch.no_grad():
        gemm(a, w.t(), y)  # out of autograd's way: served
    with pytest.raises(cutlass_aot.ArgumentError, match="alpha must be a real number"):
        gemm(a, w.t(), out, alpha=None)


def _memoized_linear(cache):
    """(cache.gemm, dtype, a, w, out): an nn.Linear-layout call of odd N made
    twice, so its layout is memoized and, where it is built, served by the
    C++ entry."""
    dt = _linear_dtype(cache)
    gemm = cache.gemm
    a = torch.randn(64, 256, device="cuda", dtype=dt)
    w = torch.randn(136, 256, device="cuda", dtype=dt)
    out = torch.full((64, 136), float("nan"), device="cuda", dtype=dt)
    for _ in range(2):
        gemm(a, w.t(), out)
    return gemm, dt, a, w, out


def test_a_negative_bit_view_is_refused_after_its_layout_is_memoized(cache, path):
    """r51: the neg-bit refusal ran at resolution only, so once a layout was
    memoized (and registered with the C++ entry, which sees DLPack's memory,
    not the bit) (-a) @ b came back as a @ b. Every call checks it now."""
    gemm, dt, a, w, out = _memoized_linear(cache)
    ref = a.double() @ w.double().t()
    assert rel_err(out, ref) < TOL[NAMES[dt]]
    for operands in ((torch._neg_view(a), w.t(), out), (a, torch._neg_view(w.t()), out)):
        out.fill_(float("nan"))
        with pytest.raises(cutlass_aot.ArgumentError, match="negative-bit view") as info:
            gemm(*operands)
        assert info.value.reason == "neg-view"
        assert torch.isnan(out).all(), "nothing written"
    gemm(torch._neg_view(a).resolve_neg(), w.t(), out)  # resolved: served, negated
    assert rel_err(out, -ref) < TOL[NAMES[dt]]


def test_outs_version_moves_and_a_zero_tensor_is_refused_on_the_real_entry(cache, path):
    """r51 review, on the real artifacts and the C++ entry: a kernel write
    bumps out's version (backward then sees the overwrite of a tensor it saved,
    as after torch.mm(out=)); a zero tensor (DLPack: a null pointer) is refused
    on a memoized layout instead of launching on address 0."""
    gemm, dt, a, w, out = _memoized_linear(cache)
    x = torch.randn(64, 136, device="cuda", dtype=dt, requires_grad=True)
    y = (x * out).sum()
    before = out._version
    with torch.no_grad():
        gemm(a, w.t(), out)
    assert out._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    zero = torch._efficientzerotensor((64, 256), device="cuda", dtype=dt)
    out.fill_(float("nan"))
    with pytest.raises(cutlass_aot.ArgumentError, match="no storage") as info:
        gemm(zero, w.t(), out)
    assert info.value.reason == "no-storage" and torch.isnan(out).all()
    gemm(a, w.t(), out)  # the context is fine: nothing launched on address 0
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ w.double().t()) < TOL[NAMES[dt]]


# ------------------------------------------------------------ epilogues
def _epilogue_entries(cache):
    found = []
    for sig in cache.signatures():
        fields = dict(normalized(sig).fields)
        if fields.get("bias") is not None or fields.get("act", "none") != "none":
            found.append(fields)
    return found


def _operand(batch, rows, cols, dtype, contiguous_last):
    if contiguous_last:
        return torch.randn(*batch, rows, cols, device="cuda", dtype=dtype)
    return torch.randn(*batch, cols, rows, device="cuda", dtype=dtype).transpose(-1, -2)


def test_every_epilogue_signature(cache, path):
    """Each bias/act signature the cache holds, through cache.gemm and the op, vs float64."""
    sigs = _epilogue_entries(cache)
    if not sigs:
        pytest.skip("the cache has no bias/act entries (build a manifest with bias/act params "
                    "to test the epilogues)")
    failures = []
    for f in sigs:
        batch = (2,) if f["rank"] == 3 else ()
        for m, n, k in [(129, 264, 136), (1, 8, 64), (1000, 136, 200)]:
            a = _operand(batch, m, k, TORCH[f["a"]], f["a_major"] == "k")
            b = _operand(batch, k, n, TORCH[f["b"]], f["b_major"] == "n")
            out = _operand(batch, m, n, TORCH[f["d"]], f["d_major"] == "n")
            c = None if f["c"] is None else _operand(batch, m, n, TORCH[f["c"]], f["d_major"] == "n")
            bias = None if f.get("bias") is None else torch.randn(n, device="cuda", dtype=TORCH[f["bias"]])
            act = f.get("act", "none")
            cache.gemm(a, b, out, c=c, bias=bias, act=act, alpha=0.75, beta=0.5)
            ref = reference(a, b, c, bias, act, 0.75, 0.5)
            err = rel_err(out, ref)
            if not err < TOL[f["d"]]:
                failures.append(f"{f} M={m} N={n} K={k}: rel err {err:.2e}")
            if f["d_major"] == "n":  # the op returns a row-major output
                y = ops.gemm(a, b, c=c, bias=bias, act=act, alpha=0.75, beta=0.5,
                             out_dtype=TORCH[f["d"]], cache=path)
                err = rel_err(y, ref)
                if not err < TOL[f["d"]]:
                    failures.append(f"op: {f} M={m} N={n} K={k}: rel err {err:.2e}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------ a model we did not write
def test_hf_llama_patched_eager_and_compiled(cache):
    """A small transformers LlamaForCausalLM: patch covers every Linear; logits match; no breaks."""
    transformers = pytest.importorskip("transformers")
    dt = _linear_dtype(cache)
    config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=4096,
                                      max_position_embeddings=1024)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = transformers.LlamaForCausalLM(config).to(dt).eval()
        model = transformers.LlamaForCausalLM(config).to(dt).eval()
    model.load_state_dict(ref.state_dict())
    report = patch(model, cache)
    assert report.coverage == 1.0, str(report)
    ids = torch.randint(0, 4096, (2, 100), device="cuda")
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits
        got = model(input_ids=ids, use_cache=False).logits
        assert rel_err(got, want.double()) < 2 * TOL[NAMES[dt]]
        compiled = torch.compile(model, fullgraph=True)
        got_c = compiled(input_ids=ids, use_cache=False).logits
        assert rel_err(got_c, want.double()) < 2 * TOL[NAMES[dt]]
        explained = torch._dynamo.explain(lambda i: model(input_ids=i, use_cache=False).logits)(ids)
    assert explained.graph_break_count == 0, explained.break_reasons
