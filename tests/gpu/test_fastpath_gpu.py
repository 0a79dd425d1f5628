"""GPU: dispatch through the entry's C++ half (run/fastpath.py) with real artifacts.

Self-contained like test_gemm_gpu.py. Fresh random inputs, NaN-poisoned
outputs, a float64 reference: the C++ memo serves plain and split-K choices
(its scratch from torch's allocator, under graph capture too) and calls with
a bias or an activation (each vector its own, under graph capture too), a
misaligned call of a registered layout still takes the staged route, and two
runners never serve each other's answers.
"""

from __future__ import annotations

import pytest
import torch
from test_gemm_gpu import ACTS, TOL, assert_replays_fresh, assert_two_streams, capture, device_cache, rel_err

from cutlass_aot.run import fastpath
from cutlass_aot.run.dispatch import GemmRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cache():
    if not fastpath.LIBRARY.is_file():
        pytest.skip(f"{fastpath.LIBRARY.name} is not built (build_scripts/build_fastpath.py)")
    assert fastpath.status() == "on", fastpath.status()
    return device_cache()


def _check(gemm, m, n, k, rounds=3):
    for _ in range(rounds):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, w.t(), out)
        torch.cuda.synchronize()
        assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"], (m, n, k)


def _split_k_shape(runner):
    """A decode shape the dispatcher serves with split-K (the model or the
    table; several are tried, so the test does not hinge on one pick)."""
    for m, n, k in ((8, 2048, 16384), (1, 1024, 28672), (16, 1536, 24576), (4, 1024, 57344),
                    (32, 768, 20480), (2, 2048, 40960)):
        a = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
        choice = runner.choice_for(a, w.t())
        if choice.candidate.split_k and not choice.staged:
            return (m, n, k), choice
    pytest.fail("no tried decode shape is served with split-K; extend the list")


def test_plain_and_split_k_choices_run_through_the_cpp_entry(cache):
    runner = cache.gemm.runner
    gemm = cache.gemm
    before = runner.fast_entries()
    _check(gemm, 512, 1024, 768)
    assert runner.fast_entries() == before + 1
    (m, n, k), choice = _split_k_shape(runner)
    print("split-K pick:", m, n, k, choice.label(), choice.source)
    _check(gemm, m, n, k)
    assert runner.fast_entries() == before + 2
    # The C++ entry launches it itself (its scratch from torch's allocator),
    # not by falling back to the Python launcher.
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert fastpath.load().call(runner._fast_table, a, w.t(), out, 1.0) == 1
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_split_k_scratch_under_graph_capture_and_two_streams(cache):
    runner = cache.gemm.runner
    (m, n, k), _ = _split_k_shape(runner)
    gemm = cache.gemm
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, w.t(), out)
    torch.cuda.synchronize()
    entries = runner.fast_entries()
    g = capture(lambda: gemm(a, w.t(), out))
    assert runner.fast_entries() == entries  # captured through the registered entry
    assert_replays_fresh(g, (a, w), out, lambda: a.double() @ w.double().t(), TOL["bf16"])
    assert_two_streams(gemm, lambda: (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                                      torch.randn(n, k, device="cuda", dtype=torch.bfloat16)),
                       (m, n), torch.bfloat16, TOL["bf16"])


def test_a_misaligned_call_of_a_registered_layout_is_still_served(cache):
    """The C++ key holds no pointer alignment: the artifact refuses a view at
    an odd offset, and the Python path serves it (staged), correctly."""
    gemm = cache.gemm
    m, n, k = 256, 512, 1024
    base = torch.randn(m * k + 8, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    aligned = base[:m * k].view(m, k)
    shifted = base[1:m * k + 1].view(m, k)  # 2 bytes off: below 16-byte alignment
    for a in (aligned, shifted, aligned, shifted):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, w.t(), out)
        torch.cuda.synchronize()
        assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_two_runners_keep_their_own_tables(cache):
    r1, r2 = cache.gemm.runner, GemmRunner(cache)  # open_cache shares one runner per cache
    n1, n2 = r1.fast_entries(), r2.fast_entries()
    _check(r2.entry(), 384, 640, 512, rounds=1)
    assert (r1.fast_entries(), r2.fast_entries()) == (n1, n2 + 1)
    r2.set_autotune(0)  # forgets every choice, in the C++ table too
    assert (r1.fast_entries(), r2.fast_entries()) == (n1, 0)


def _bias_case(gemm, m, n, k, act, with_bias=True, rounds=3):
    """Fresh inputs each round (a new bias vector too), NaN-poisoned out."""
    for _ in range(rounds):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, w.t(), out, bias=bias, act=act, alpha=0.5)
        torch.cuda.synchronize()
        ref = 0.5 * (a.double() @ w.double().t())
        if bias is not None:
            ref = ref + bias.double()
        assert rel_err(out, ACTS[act](ref)) < TOL["bf16"], (m, n, k, act, with_bias)


@pytest.mark.parametrize("m, n, k, act, with_bias", [
    (512, 1024, 768, "gelu", True),      # nn.Linear with a bias, fused GELU
    (520, 1000, 776, None, True),        # a bias alone, odd sizes
    (8, 2048, 16384, "gelu", True),      # decode with a bias (a swapped tile, maybe split-K)
    (384, 512, 256, "relu", False),      # an activation alone: the plain ABI
])
def test_bias_and_activation_calls_run_through_the_cpp_entry(cache, m, n, k, act, with_bias):
    runner = cache.gemm.runner
    gemm = cache.gemm
    # The pick first: choice_for re-resolves, which clears the C++ table.
    choice = runner.choice_for(torch.empty(m, k, device="cuda", dtype=torch.bfloat16),
                               torch.empty(n, k, device="cuda", dtype=torch.bfloat16).t(),
                               bias=torch.empty(n, device="cuda", dtype=torch.bfloat16)
                               if with_bias else None, act=act)
    print("pick:", m, n, k, act, with_bias, choice.label(), choice.source)
    before = runner.fast_entries()
    _bias_case(gemm, m, n, k, act, with_bias)
    if not choice.staged:
        assert runner.fast_entries() == before + 1
        # The C++ entry launches it itself, with this call's own vector.
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        code = fastpath.ACT_CODES[act]
        assert fastpath.load().call_bias(runner._fast_table, a, w.t(), out, bias, code, 1.0) == 1
        torch.cuda.synchronize()
        ref = a.double() @ w.double().t() + (0 if bias is None else bias.double())
        assert rel_err(out, ACTS[act](ref)) < TOL["bf16"]
        # The same layout without the bias, or with another activation, is
        # not that entry's: the plain call resolves on its own and is right.
        _check(gemm, m, n, k, rounds=1)
        assert runner.fast_entries() == before + 2


def test_bias_calls_under_graph_capture_keep_their_vector(cache):
    gemm = cache.gemm
    m, n, k = 256, 768, 512
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, w.t(), out, bias=bias, act="gelu")
    torch.cuda.synchronize()
    entries = gemm.runner.fast_entries()
    g = capture(lambda: gemm(a, w.t(), out, bias=bias, act="gelu"))
    assert gemm.runner.fast_entries() == entries
    assert_replays_fresh(g, (a, bias), out,
                         lambda: ACTS["gelu"](a.double() @ w.double().t() + bias.double()), TOL["bf16"])
