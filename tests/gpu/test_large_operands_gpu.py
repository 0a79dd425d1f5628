"""Operands past 2**31 elements: what the 32-bit layout offsets may and may not reach.

The artifacts declare shapes and strides as 32-bit CuTe integers, and CuTe
computes a layout's offsets in that width (NVIDIA/cutlass#2312). Dispatch
therefore keeps calls whose layout-indexed operands span more than 2**31
elements away from such variants (select.within_index_limit): the gemv and
sm80 families index every operand, sm90_gemm only C (A, B and D move by
TMA, whose descriptor carries 64-bit strides). These tests pin both sides on
the GPU: the large calls that are served give the right values where the
offsets pass 2**31, and a C that large is refused, not wrapped.

Each test allocates 4-9 GB; the H200 has room. Self-contained like
test_gemm_gpu.py (run with `pytest --noconftest tests/gpu`, cache in
CUTLASS_AOT_CACHE_DIR). Fresh random inputs, NaN-poisoned outputs, float64
references on the rows past the limit; NaN never passes.
"""

from __future__ import annotations

import gc

import pytest
import torch
from test_gemm_gpu import device_cache

import cutlass_aot
from cutlass_aot.errors import KernelNotFoundError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LIMIT = 1 << 31


@pytest.fixture(scope="module")
def cache():
    return device_cache()


@pytest.fixture(autouse=True)
def _free():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _rows_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    err = (got.double() - ref).norm() / ref.norm()
    assert err < 2e-2, float(err)


def test_a_weight_past_2_31_elements_at_one_token_is_served_right(cache):
    """An LM head of 262208 x 8192 (4.3 GB): the gemv family would index its
    last rows past 2**31; dispatch takes a TMA variant instead. The rows
    whose offsets pass 2**31 (row 262144 on) are checked, and the first."""
    n, k = 262208, 8192
    a = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    assert w.numel() > LIMIT
    choice = cache.gemm.runner.choice_for(a, w.t())
    assert not choice.candidate.gemv and not choice.candidate.extra, choice.label()
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    for rows in (slice(0, 64), slice(LIMIT // k - 64, n)):
        _rows_close(out[:, rows], a.double() @ w[rows].double().t())


def test_an_output_past_2_31_elements_is_written_right_by_tma(cache):
    """D of 65536 x 32776 (2**31 + 2**19 elements) through sm90_gemm's TMA
    store: the rows past the limit hold the product, nothing wrapped onto
    the first rows."""
    m, n, k = 65536, 32776, 64
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    last = LIMIT // n
    for rows in (slice(0, 16), slice(last - 1, last + 15), slice(m - 16, m)):
        _rows_close(out[rows], a[rows].double() @ w.double().t())


def test_a_c_past_2_31_elements_is_refused_or_served_by_torch(cache):
    """sm90_gemm reads C through its layout: a C of more than 2**31 elements
    is a coverage gap that names C, and on_miss="torch" serves it right."""
    m, n, k = 65536, 32776, 64
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(KernelNotFoundError, match="c spans"):
        cache.gemm(a, w.t(), out, c=c)
    lenient = cutlass_aot.open_cache(cache.path, on_miss="torch")
    out.fill_(float("nan"))
    lenient.gemm(a, w.t(), out, c=c)
    torch.cuda.synchronize()
    rows = slice(m - 16, m)
    _rows_close(out[rows], a[rows].double() @ w.double().t() + c[rows].double())
