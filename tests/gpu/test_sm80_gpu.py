"""GPU correctness of every sm80_gemm artifact in a built cache that this GPU can run.

Self-contained (no conftest): `pytest --noconftest tests/gpu/test_sm80_gpu.py`
on a machine with torch (CUDA), tvm_ffi, this package and a cache built with
the sm80_gemm manifests for the device (on an H200: configs/sm90-lowalign.yaml,
arch sm_90) in $CUTLASS_AOT_CACHE_DIR.

Artifacts are called directly through ``cache.function(key)`` with the GEMM
ABI, so these tests do not depend on the dispatcher. For every variant:

* odd sizes (M, N, K not multiples of the tile, of 8, or of the copy vector),
  K shorter than one k-tile, batched where the variant is rank 3;
* packed views (leading dim = extent), padded views, and views whose
  pointer and strides have exactly the variant's alignment (2, 4 or 8 bytes:
  views starting 2, 4 or 8 bytes into their storage);
* outputs poisoned with NaN inside the view and a sentinel everywhere else in
  their storage: every element of the view must be written (finite, correct
  against a float64 reference) and nothing outside it may be;
* operands less aligned than the variant needs are refused by the artifact's
  own checks, and the output is left untouched.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_gemm_gpu import assert_cases_pass, device_cache

import cutlass_aot
from cutlass_aot.archs import runnable_archs
from cutlass_aot.signature import ARCH_BY_CAPABILITY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
TOL = {"f16": 4e-3, "bf16": 2e-2, "f32": 1e-4}
SENTINEL = 12288.0  # exact in bf16, f16 and f32

# (M, N, K, L): odd extents, K below one k-tile, exact tiles, a long K with a
# partial vector at its end, single rows and columns.
SIZES = [
    (129, 263, 77, 2),
    (1, 9, 13, 1),
    (1000, 130, 136, 3),
    (300, 520, 1025, 1),
    (64, 64, 32, 1),
    (257, 129, 2049, 2),
    (3, 517, 4097, 1),
    (777, 31, 5, 1),
]


@pytest.fixture(scope="module")
def cache():
    return device_cache()


@pytest.fixture(scope="module")
def device_arch():
    return ARCH_BY_CAPABILITY[torch.cuda.get_device_capability()]


def sm80_entries(cache, device_arch):
    runnable = runnable_archs(device_arch)
    out = [e for e in cache.entries.values()
           if e.record["family"] == "sm80_gemm" and e.signature.arch in runnable]
    return sorted(out, key=lambda e: (str(e.signature), e.key))


def _exact_ld(extent: int, align: int, elem: int) -> int:
    """A leading dim >= extent whose byte stride has alignment exactly ``align``."""
    step = max(1, align // elem)
    ld = -(-extent // step) * step
    if align < 16 and (ld * elem) % (2 * align) == 0:
        ld += step
    return ld


class View:
    """A strided view into its own storage, which is kept for the poison check."""

    def __init__(self, batch, rows, cols, dtype, contiguous_last, *, align, offset_bytes, pad=0,
                 fill=None, device="cuda"):
        elem = torch.empty((), dtype=dtype).element_size()
        inner = cols if contiguous_last else rows
        outer = rows if contiguous_last else cols
        ld = _exact_ld(inner, align, elem) + pad
        offset = offset_bytes // elem
        mat = outer * ld
        if batch:
            bstride = _exact_ld(mat, align, elem)
            size, stride = (batch, rows, cols), ((bstride,) + ((ld, 1) if contiguous_last else (1, ld)))
            numel = offset + batch * bstride
        else:
            size, stride = (rows, cols), ((ld, 1) if contiguous_last else (1, ld))
            numel = offset + mat
        self.storage = torch.empty(numel + 8, dtype=dtype, device=device)
        if fill is None:
            self.storage.copy_(torch.randn(self.storage.shape, device=device).to(dtype))
        else:
            self.storage.fill_(fill)
        self.view = self.storage.as_strided(size, stride, offset)
        self.mask = torch.zeros(self.storage.shape, dtype=torch.bool, device=device)
        self.mask.as_strided(size, stride, offset).fill_(True)


def _call(fn, sig, a, b, d, c, alpha, beta, sms):
    if sig["c"] is not None:
        fn(a, b, d, c, alpha, beta, sms)
    else:
        fn(a, b, d, alpha, sms)


def check_case(fn, sig, m, n, k, nb, *, align, offset_bytes, pad, sms):
    """One call on fresh operands; returns None or a one-line failure."""
    batch = nb if sig["rank"] == 3 else 0
    ab_align = align
    d_elem = 4 if sig["d"] == "f32" else 2
    d_align = max(align, d_elem)
    d_off = offset_bytes if offset_bytes % d_elem == 0 else 0
    a = View(batch, m, k, TORCH[sig["a"]], sig["a_major"] == "k", align=ab_align,
             offset_bytes=offset_bytes, pad=pad)
    b = View(batch, k, n, TORCH[sig["b"]], sig["b_major"] == "n", align=ab_align,
             offset_bytes=offset_bytes, pad=pad)
    d = View(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", align=d_align,
             offset_bytes=d_off, pad=pad, fill=SENTINEL)
    d.view.fill_(float("nan"))
    c = None
    if sig["c"] is not None:
        c = View(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", align=d_align,
                 offset_bytes=d_off, pad=pad).view
    alpha = random.uniform(0.5, 2.0)
    beta = random.uniform(-1.5, 1.5)
    _call(fn, sig, a.view, b.view, d.view, c, alpha, beta, sms)
    torch.cuda.synchronize()
    ref = alpha * (a.view.double() @ b.view.double())
    if c is not None:
        ref = ref + beta * c.double()
    out = d.view
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out)).nonzero()[:3].tolist()
        return f"NaN/inf in output (unwritten elements?) at {bad}"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err < TOL[sig["d"]]:
        return f"relative error {err:.2e} > {TOL[sig['d']]:.0e}"
    outside = d.storage[~d.mask]
    if not (outside.float() == SENTINEL).all():
        return "kernel wrote outside the output view"
    return None


def test_every_sm80_variant_is_correct(cache, device_arch):
    """Each variant x sizes x {exact alignment, offset view, padded, 16-aligned}.

    Checks everything before failing and prints one line per failure.
    """
    entries = sm80_entries(cache, device_arch)
    if not entries:
        pytest.skip(f"no sm80_gemm entries in the cache runnable on {device_arch}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    random.seed(1234)
    torch.manual_seed(1234)
    failures, checked, aligns = [], 0, set()
    for e in entries:
        sig = dict(e.signature.fields)
        fn = cache.function(e.key)
        align = sig["align"]
        aligns.add(align)
        layouts = [("exact", align, 0, 0), ("padded16", 16, 0, 8)]
        if align < 16:
            # A view starting `align` bytes into its storage (2, 4 or 8).
            layouts.append(("offset", align, align, 0))
        for name, view_align, offset, pad in layouts:
            for m, n, k, nb in SIZES:
                checked += 1
                try:
                    problem = check_case(fn, sig, m, n, k, nb, align=view_align,
                                         offset_bytes=offset, pad=pad, sms=sms)
                except Exception as exc:  # noqa: BLE001 - report every case
                    problem = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                if problem:
                    v = e.variant
                    failures.append(f"{e.signature} tile={v['tile']} warps={v['warps']} "
                                    f"stages={v['stages']} [{name}] M={m} N={n} K={k} L={nb}: {problem}")
    assert_cases_pass(failures, checked,
                      f"checked {checked} (variant, layout, size) cases over {len(entries)} variants "
                      f"(aligns {sorted(aligns)}), {len(failures)} failed")


def test_under_aligned_operands_are_refused_by_the_artifact(cache, device_arch):
    """A variant never reads operands less aligned than its signature says."""
    entries = [e for e in sm80_entries(cache, device_arch) if e.signature.get("align") > 2]
    if not entries:
        pytest.skip("no sm80_gemm entry with align > 2 runnable here")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    refused, checked = 0, 0
    for e in entries:
        sig = dict(e.signature.fields)
        fn = cache.function(e.key)
        half = sig["align"] // 2
        batch = 2 if sig["rank"] == 3 else 0
        for which in ("a", "b"):
            checked += 1
            a = View(batch, 64, 64, TORCH[sig["a"]], sig["a_major"] == "k", align=16,
                     offset_bytes=half if which == "a" else 0)
            b = View(batch, 64, 64, TORCH[sig["b"]], sig["b_major"] == "n", align=16,
                     offset_bytes=half if which == "b" else 0)
            d = View(batch, 64, 64, TORCH[sig["d"]], sig["d_major"] == "n", align=16,
                     offset_bytes=0, fill=SENTINEL)
            d.view.fill_(float("nan"))
            c = d.view.clone() if sig["c"] is not None else None
            with pytest.raises(Exception) as info:  # the artifact's alignment check
                _call(fn, sig, a.view, b.view, d.view, c, 1.0, 0.0, sms)
            assert not isinstance(info.value, cutlass_aot.CutlassAotError)
            torch.cuda.synchronize()
            assert torch.isnan(d.view).all(), f"{e.signature}: refused call wrote the output"
            refused += 1
    print(f"{refused} of {checked} under-aligned calls refused")


def test_zero_k_writes_beta_c_and_empty_outputs_launch_nothing(cache, device_arch):
    """K = 0: D = beta * C (or zeros); the k-loop is empty, the epilogue still runs."""
    entries = sm80_entries(cache, device_arch)
    if not entries:
        pytest.skip(f"no sm80_gemm entries in the cache runnable on {device_arch}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for e in entries:
        sig = dict(e.signature.fields)
        if sig["rank"] != 2:
            continue
        fn = cache.function(e.key)
        a = View(0, 33, 0, TORCH[sig["a"]], sig["a_major"] == "k", align=16, offset_bytes=0)
        b = View(0, 0, 17, TORCH[sig["b"]], sig["b_major"] == "n", align=16, offset_bytes=0)
        d = View(0, 33, 17, TORCH[sig["d"]], sig["d_major"] == "n", align=16, offset_bytes=0,
                 fill=SENTINEL)
        d.view.fill_(float("nan"))
        c = View(0, 33, 17, TORCH[sig["d"]], sig["d_major"] == "n", align=16, offset_bytes=0).view
        _call(fn, sig, a.view, b.view, d.view, c, 2.0, 0.5, sms)
        torch.cuda.synchronize()
        want = 0.5 * c.double() if sig["c"] is not None else torch.zeros_like(c, dtype=torch.float64)
        assert torch.allclose(d.view.double(), want, atol=1e-2), str(e.signature)
        assert (d.storage[~d.mask].float() == SENTINEL).all()
