"""Hostile arguments on the GPU: generated calls with CUDA tensors.

Each call draws random dtypes, ranks, shapes (zero, odd, mismatched),
layouts (row/column-major, transposed, padded, broadcast, sliced with a
pointer offset) and optional out/c. Contract: the call raises a
CutlassAotError before launching, or it returns and the result matches a
float64 reference (poisoned output, NaN never passes). No crash, no CUDA
error, no wrong result. Runs on the device machine.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import cutlass_aot

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.bfloat16, torch.bfloat16, torch.float16, torch.float32, torch.int8]
SIZES = [0, 1, 7, 8, 16, 63, 64, 72, 129, 256]


def _tensor(rng, batch, rows, cols, dtype):
    kind = rng.random()
    if kind < 0.45:  # row-major, maybe padded
        ld = cols + rng.choice([0, 0, 1, 8])
        t = torch.randn(*batch, rows, max(ld, 1), device="cuda").to(dtype) if dtype.is_floating_point \
            else torch.randint(-3, 3, (*batch, rows, max(ld, 1)), device="cuda", dtype=dtype)
        return t[..., :cols]
    if kind < 0.75:  # column-major view, maybe padded
        ld = rows + rng.choice([0, 0, 1, 8])
        t = torch.randn(*batch, cols, max(ld, 1), device="cuda").to(dtype) if dtype.is_floating_point \
            else torch.randint(-3, 3, (*batch, cols, max(ld, 1)), device="cuda", dtype=dtype)
        return t.transpose(-1, -2)[..., :rows, :]
    if kind < 0.85:  # pointer offset by one element
        flat = torch.randn(rows * cols + 1, device="cuda").to(dtype) if dtype.is_floating_point \
            else torch.zeros(rows * cols + 1, device="cuda", dtype=dtype)
        return flat[1:].view(rows, cols) if not batch else flat[1:1 + 0].view(0, 0)[:0]
    if kind < 0.92:  # broadcast (stride 0)
        return torch.randn(1, cols, device="cuda").to(dtype).expand(rows, cols) if dtype.is_floating_point \
            else torch.zeros(rows, cols, device="cuda", dtype=dtype)
    return torch.randn(*batch, rows, cols, device="cuda").to(dtype) if dtype.is_floating_point \
        else torch.zeros(*batch, rows, cols, device="cuda", dtype=dtype)


def test_generated_gpu_calls_raise_or_compute_correctly():
    cache_dir = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not cache_dir:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    gemm = cutlass_aot.open_cache(cache_dir).gemm
    rng = random.Random(20261129)
    calls = int(os.environ.get("CUTLASS_AOT_GPU_FUZZ_CALLS", "3000"))
    raised = computed = 0
    wrong = []
    for i in range(calls):
        rank = rng.choice([2, 2, 3])
        batch = (rng.choice([1, 2, 3]),) if rank == 3 else ()
        m, n, k = rng.choice(SIZES), rng.choice(SIZES), rng.choice(SIZES)
        if rng.random() < 0.1:
            k2 = rng.choice(SIZES)  # mismatched K
        else:
            k2 = k
        dt = rng.choice(DTYPES)
        a = _tensor(rng, batch, m, k, dt)
        b = _tensor(rng, batch, k2, n, rng.choice([dt, dt, dt, rng.choice(DTYPES)]))
        out = None
        if rng.random() < 0.6:
            odt = rng.choice([dt, dt, torch.float32, rng.choice(DTYPES)])
            out = _tensor(rng, batch, m, n, odt)
        c = None
        if rng.random() < 0.25 and out is not None:
            c = _tensor(rng, batch, m, n, out.dtype)
        if out is not None and out.dtype.is_floating_point and out.numel():
            try:
                out.fill_(float("nan"))
            except RuntimeError:
                pass  # broadcast views cannot be written; the call must refuse them
        alpha, beta = rng.uniform(-2, 2), rng.uniform(-2, 2)
        try:
            res = gemm(a, b, out, c=c, alpha=alpha, beta=beta)
        except cutlass_aot.CutlassAotError:
            raised += 1
            continue
        torch.cuda.synchronize()
        computed += 1
        ref = alpha * (a.double() @ b.double())
        if c is not None:
            ref = ref + beta * c.double()
        if res.numel() == 0:
            continue
        tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}[res.dtype]
        err = ((res.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if not (torch.isfinite(res).all() and err < tol):
            wrong.append(f"call {i}: a{tuple(a.shape)}{a.stride()} {a.dtype} b{tuple(b.shape)}{b.stride()} "
                         f"-> {res.dtype} err={err:.2e}")
    print(f"gpu hostile calls: {calls}, raised {raised}, computed {computed}, wrong {len(wrong)}")
    assert not wrong, wrong[:10]
    assert raised > 0 and computed > 0
