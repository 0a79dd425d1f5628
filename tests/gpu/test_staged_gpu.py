"""GPU correctness of the staged route: calls below 16-byte alignment served by the TMA variants.

Self-contained (no conftest): `pytest --noconftest tests/gpu/test_staged_gpu.py`
with a cache in $CUTLASS_AOT_CACHE_DIR. Each 16-byte signature the cache holds
for this GPU's arch is called through the dispatcher (``cache.gemm``) with
operands whose pointers and strides are exactly 2, 4 or 8 bytes aligned
(views starting 2, 4 or 8 bytes into their storage, leading dims that are odd
multiples of the alignment), odd sizes, and rank 3 where the signature is
batched, and with aligned operands whose out ends its rows off a 16-byte
boundary inside a padded pitch. Outputs are poisoned with NaN inside the view
and a sentinel outside it (the padding included); every element of the view
must be written and agree with a float64 reference (alpha * AB + beta * C +
bias, then the activation), and nothing outside it may change. Each test
runs with the route forced to "staged" (``GemmRunner.set_unaligned``), and
where it says so under "auto" too (the model may then pick a low-alignment
variant). Such calls count as hits (staged ones as staged), never as
fallbacks.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from test_gemm_gpu import device_cache
from test_sm80_gpu import SENTINEL, TOL, TORCH, View

from cutlass_aot.layout import GEMM_ABIS
from cutlass_aot.signature import ARCH_BY_CAPABILITY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (M, N, K, L): odd extents on every side, K below one k-block, a long odd K
# (split-K territory), a decode row, one tile exactly, and N = 1 (torch gives
# a [M, 1] tensor strides (1, 1): rows 2 bytes apart).
SIZES = [(129, 263, 77, 2), (1, 4097, 515, 1), (300, 520, 1025, 3), (257, 129, 4099, 2),
         (3, 517, 4097, 1), (128, 128, 64, 1), (77, 1, 64, 1)]
# (name, alignment in bytes of pointers and strides, offset of the view in bytes).
# "odd-edge": every pointer and stride 16-byte aligned, rows padded to the
# next 16 bytes, so an odd N (M for column-major D) ends out's rows inside
# the pitch: a TMA store's last chunk would write past the edge, and the
# dispatcher must write out through scratch instead (run/pitch.py odd_edge).
LAYOUTS = [("offset2", 2, 2), ("align4", 4, 4), ("align8", 8, 8), ("odd-ld", 2, 0),
           ("odd-edge", 16, 0)]

ACTS = {
    "none": lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "gelu_erf": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


@pytest.fixture(scope="module")
def cache():
    return device_cache()


def aligned_signatures(cache) -> list[dict]:
    """The 16-byte GEMM signatures of this GPU's own arch that the cache holds."""
    arch = ARCH_BY_CAPABILITY[torch.cuda.get_device_capability()]
    out = []
    for sig, entries in cache.by_signature.items():
        fields = dict(sig.fields)
        if (sig.op == "gemm" and sig.arch == arch and fields.get("align") == 16
                and any(e.record["abi"] in GEMM_ABIS for e in entries)):
            out.append(fields)
    return sorted(out, key=str)


def staged_case(cache, sig: dict, m, n, k, nb, *, align: int, offset: int) -> str | None:
    """One dispatcher call on fresh, misaligned operands; None or a one-line failure."""
    batch = nb if sig["rank"] == 3 else 0
    d_elem = 4 if sig["d"] == "f32" else 2
    d_align, d_off = max(align, d_elem), (offset if offset % d_elem == 0 else 0)
    a = View(batch, m, k, TORCH[sig["a"]], sig["a_major"] == "k", align=align, offset_bytes=offset)
    b = View(batch, k, n, TORCH[sig["b"]], sig["b_major"] == "n", align=align, offset_bytes=offset)
    d = View(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", align=d_align,
             offset_bytes=d_off, fill=SENTINEL)
    d.view.fill_(float("nan"))
    c = None
    if sig["c"] is not None:
        c = View(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", align=d_align,
                 offset_bytes=d_off).view
    bias = None
    if sig.get("bias") is not None:
        bias = torch.randn(n, device="cuda").to(TORCH[sig["bias"]])
    act = sig.get("act", "none")
    alpha, beta = random.uniform(0.5, 2.0), random.uniform(-1.5, 1.5)
    cache.gemm(a.view, b.view, d.view, c=c, bias=bias, act=act, alpha=alpha, beta=beta)
    torch.cuda.synchronize()
    ref = alpha * (a.view.double() @ b.view.double())
    if c is not None:
        ref = ref + beta * c.double()
    if bias is not None:
        ref = ref + bias.double()
    ref = ACTS[act](ref)
    out = d.view
    if not torch.isfinite(out).all():
        return f"NaN/inf in output at {(~torch.isfinite(out)).nonzero()[:3].tolist()}"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err < TOL[sig["d"]]:
        return f"relative error {err:.2e} > {TOL[sig['d']]:.0e}"
    if not (d.storage[~d.mask].float() == SENTINEL).all():
        return "wrote outside the output view"
    return None


@pytest.fixture
def route(cache, request):
    """Set the dispatcher's unaligned route for one test, then restore "auto"."""
    cache.gemm.runner.set_unaligned(request.param)
    yield request.param
    cache.gemm.runner.set_unaligned("auto")


@pytest.mark.parametrize("route", ["staged", "auto"], indirect=True)
def test_every_aligned_signature_serves_misaligned_calls(cache, route):
    """Forced staging on every signature; then "auto", where the model may
    send a call to a low-alignment variant instead (same checks)."""
    sigs = aligned_signatures(cache)
    if not sigs:
        pytest.skip("no 16-byte GEMM signatures for this GPU in the cache")
    random.seed(2026)
    torch.manual_seed(2026)
    failures, checked = [], 0
    before = cache.stats()["totals"]
    for sig in sigs:
        for name, align, offset in LAYOUTS:
            for m, n, k, nb in SIZES:
                checked += 1
                try:
                    why = staged_case(cache, sig, m, n, k, nb, align=align, offset=offset)
                except Exception as exc:  # noqa: BLE001 - report every case, then fail
                    why = f"{type(exc).__name__}: {exc}"
                if why:
                    failures.append(f"{sig} {name} {m}x{n}x{k}x{nb}: {why}")
    after = cache.stats()["totals"]
    print(f"route {route}: checked {checked} calls over {len(sigs)} signatures; {len(failures)} failed")
    assert not failures, "\n".join(failures[:40])
    assert after["fallbacks"] == before["fallbacks"] and after["misses"] == before["misses"]
    if route == "staged":
        assert after["staged"] > before["staged"]


def _linear_operands(dt, m, n, k):
    base = torch.empty(m * k + 1, device="cuda", dtype=dt)
    a = base[1:].view(m, k)  # 2 bytes past alignment
    w = torch.randn(n, k, device="cuda", dtype=dt)
    return base, a, w


def _linear_dtype(cache):
    for sig in aligned_signatures(cache):
        layout = (sig["a_major"], sig["b_major"], sig["d_major"], sig["rank"], sig["c"])
        epilogue = (sig.get("bias"), sig.get("act", "none"))
        if layout == ("k", "k", "n", 2, None) and epilogue == (None, "none") and sig["d"] == sig["a"]:
            return TORCH[sig["a"]]
    pytest.skip("no nn.Linear-layout signature in the cache")


@pytest.mark.parametrize("route", ["staged"], indirect=True)
def test_staged_call_captures_in_a_cuda_graph_and_replays_new_inputs(cache, route):
    """The scratch copies come from the graph's pool: replays with new inputs stay correct."""
    dt = _linear_dtype(cache)
    m, n, k = 77, 300, 1001  # odd K: A and B staged; N * 2 bytes = 600: out staged too
    base, a, w = _linear_operands(dt, m, n, k)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    a.copy_(torch.randn(m, k, device="cuda"))
    cache.gemm(a, w.t(), out)  # resolve and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cache.gemm(a, w.t(), out)
        with torch.cuda.graph(graph, stream=stream):
            cache.gemm(a, w.t(), out)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        a.copy_(torch.randn(m, k, device="cuda"))
        w.copy_(torch.randn(n, k, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = a.double() @ w.double().t()
        assert torch.isfinite(out).all()
        assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[{torch.bfloat16: "bf16",
                                                                       torch.float16: "f16"}[dt]]


@pytest.mark.parametrize("route", ["staged", "auto"], indirect=True)
def test_one_dispatch_key_serves_aligned_and_misaligned_calls(cache, route):
    """Same shapes, so the same dispatch key: a misaligned call re-routes an
    aligned entry to the staged route, and an aligned call through a staged
    entry passes straight through. Both stay correct."""
    dt = _linear_dtype(cache)
    m, n, k = 200, 256, 512
    base, odd, w = _linear_operands(dt, m, n, k)
    odd.copy_(torch.randn(m, k, device="cuda"))
    even = torch.randn(m, k, device="cuda", dtype=dt)
    tol = TOL[{torch.bfloat16: "bf16", torch.float16: "f16"}[dt]]
    for a in (even, odd, even, odd):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
        cache.gemm(a, w.t(), out)
        torch.cuda.synchronize()
        ref = a.double() @ w.double().t()
        assert ((out.double() - ref).norm() / ref.norm()).item() < tol
        assert math.isfinite(out.double().sum().item())
