"""GPU correctness of autotuned dispatch (run/autotune.py).

Self-contained (no conftest): `pytest --noconftest tests/gpu/test_autotune_gpu.py`
with a cache in $CUTLASS_AOT_CACHE_DIR. With autotune on, a new key's first
call times the model's leading options on the call's own operands and keeps
the fastest. Each test uses fresh random inputs, NaN-poisoned outputs and a
float64 reference: the timing runs must leave nothing behind (an in-place
residual, out aliasing C, must still read the original C), the chosen option
must be one of the leading ones, and under CUDA graph capture (where the
host cannot wait on timing events) the model's choice must stand.
"""

from __future__ import annotations

import pytest
import torch
from test_gemm_gpu import device_cache, rel_err

from cutlass_aot.run import autotune, select
from cutlass_aot.run.dispatch import device_info, launch_choice

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
# Odd extents, a decode row, a long K (split-K options), a short K.
SHAPES = [(777, 3000, 520), (1, 4096, 4096), (64, 4096, 14336), (4100, 1032, 264), (3, 520, 8200)]


@pytest.fixture(scope="module")
def cache():
    c = device_cache()
    c.gemm.runner.set_autotune(6)
    yield c
    c.gemm.runner.set_autotune(0)


def leading_labels(cache, a, b, out) -> set[str]:
    runner = cache.gemm.runner
    sig = runner._signature(a, b, out, None, None, None)
    cands = runner._candidates_for(sig)
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    sms = device_info(a.get_device())[1]
    first = select.choose(cands, m, n, k, 1, sms, None)
    return {ch.label() for ch, _ in autotune.leading_options(cands, m, n, k, 1, sms, 6,
                                                             first=first)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_autotuned_call_is_correct_and_picks_a_leading_option(cache, shape, dtype):
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / 16
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    cache.gemm.runner._memo.clear()
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    ref = a.double() @ w.double().t()
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < TOL[dtype], shape
    choice = cache.gemm.runner.choice_for(a, w.t(), out)
    assert choice.source in ("autotune", "table"), choice
    if choice.source == "autotune":
        assert choice.label() in leading_labels(cache, a, w.t(), out)
    # The memoized pick serves the next call with new inputs.
    a2 = torch.randn_like(a)
    out.fill_(float("nan"))
    cache.gemm(a2, w.t(), out)
    torch.cuda.synchronize()
    assert rel_err(out, a2.double() @ w.double().t()) < TOL[dtype]


def test_in_place_residual_reads_the_original_c(cache):
    """out is c: the timing runs write scratch, so the call adds the original C."""
    sigs = [s for s in cache.signatures() if dict(s.fields).get("c") == "bf16"
            and dict(s.fields).get("rank") == 2 and dict(s.fields).get("align") == 16
            and dict(s.fields).get("b_major") == "k" and dict(s.fields).get("d_major") == "n"]
    if not sigs:
        pytest.skip("the cache has no bf16 with-C variant in the nn.Linear layout")
    m, n, k = 1000, 1032, 776
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
    c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ w.double().t() + c.double()
    cache.gemm.runner._memo.clear()
    cache.gemm(a, w.t(), c, c=c, beta=1.0)
    torch.cuda.synchronize()
    assert torch.isfinite(c).all()
    assert rel_err(c, ref) < TOL[torch.bfloat16]


def test_bias_and_gelu_autotuned(cache):
    sigs = [s for s in cache.signatures() if dict(s.fields).get("bias") == "bf16"
            and dict(s.fields).get("act") == "gelu"]
    if not sigs:
        pytest.skip("the cache has no bf16 bias+gelu variant")
    m, n, k = 333, 2056, 1032
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cache.gemm.runner._memo.clear()
    cache.gemm(a, w.t(), out, bias=bias, act="gelu")
    torch.cuda.synchronize()
    ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double(), approximate="tanh")
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert cache.gemm.runner.choice_for(a, w.t(), out, bias=bias, act="gelu").source == "autotune"


def test_first_call_under_graph_capture_keeps_the_model_choice(cache):
    m, n, k = 515, 2048, 1032
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    runner = cache.gemm.runner
    # Load the model's choice outside capture (a first launch loads its
    # module), then resolve the key for the first time inside the capture.
    sig = runner._signature(a, w.t(), out, None, None, None)
    sms = device_info(0)[1]
    model = select.choose(runner._candidates_for(sig), m, n, k, 1, sms, None)
    launch_choice(cache, model, sms, m, n, 1, k=k)(a, w.t(), torch.empty_like(out))
    torch.cuda.synchronize()
    runner._memo.clear()
    runner.last_choice.clear()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cache.gemm(a, w.t(), out)
    torch.cuda.current_stream().wait_stream(stream)
    (choice,) = runner.last_choice.values()
    assert choice.source in ("model", "table"), choice
    assert choice.label() == model.label() or choice.source == "table"
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ w.double().t()) < TOL[torch.bfloat16]


@pytest.mark.parametrize("m, n", [(5000, 5008), (7512, 5000)])
def test_long_k_walk_stands_untimed_and_is_correct(cache, m, n):
    """r55: where the model's choice is the long-K order's walk
    (select.autotune_defers), autotune keeps it untimed (a burst would rank
    the 128x256 walks first, which lose under the power cap), and the call
    is correct; a table row, where one covers the problem, stands as always.
    r57-r58: with M > N the walk is the swapped one (along the shorter
    side). r59: the walk is the banded one (swizzle 8) the shipped manifest
    builds; its last band here is narrower than eight (27 or 40 tile columns
    of 192 walked in 1x2 clusters), and every output is checked. r60: both
    grids leave their last wave mostly idle, so the model runs the band's
    split-K form, its tail split or streamed along K (passed on an H100)."""
    k = 16392
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    runner = cache.gemm.runner
    runner._memo.clear()
    runner.last_choice.clear()
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert rel_err(out, a.float() @ w.float().t()) < TOL[torch.bfloat16]
    (choice,) = runner.last_choice.values()
    sig = runner._signature(a, w.t(), out, None, None, None)
    model = select.model_choice(runner._candidates_for(sig), m, n, k, 1, device_info(0)[1])
    if choice.source == "model":
        assert select.autotune_defers(model, m, n, k, 1), model.label()
        assert choice.label() == model.label()
        assert choice.candidate.swap_ab == (m > n), choice.label()
        assert (choice.candidate.raster, choice.candidate.swizzle) == ("m", 8), choice.label()
    else:
        assert choice.source in select.TABLE_SOURCES, choice
