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


def _describe(t) -> str:
    if t is None:
        return "None"
    return (f"{tuple(t.shape)} stride {t.stride()} offset {t.storage_offset()} {str(t.dtype)[6:]} "
            f"ptr%16={t.data_ptr() % 16}")


def _synced(i, a, b, out, c, alpha, beta, runner, before, how):
    """Wait for the call's work; a CUDA fault fails the test naming the call
    (its operands and what dispatch resolved for it), not a later one. r62's
    suite at 59adaf7 met an illegal memory access here that said neither, and
    a CUDA error is sticky: every later test of the process failed with it."""
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 -- torch.AcceleratorError on torch >= 2.8
        resolved = [ch.label() + f" ({ch.source})" for key, ch in runner.last_choice.items()
                    if before.get(key) is not ch]
        pytest.fail(f"call {i} ({how}) faulted: a {_describe(a)}; b {_describe(b)}; out "
                    f"{_describe(out)}; c {_describe(c)}; alpha {alpha:.4f} beta {beta:.4f}; "
                    f"resolved {resolved or 'nothing new (a memoized or staged path)'}: {exc}")


def test_generated_gpu_calls_raise_or_compute_correctly():
    cache_dir = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not cache_dir:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    gemm = cutlass_aot.open_cache(cache_dir).gemm
    runner = gemm.runner
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
        before = dict(runner.last_choice)
        try:
            res = gemm(a, b, out, c=c, alpha=alpha, beta=beta)
        except cutlass_aot.CutlassAotError:
            raised += 1
            _synced(i, a, b, out, c, alpha, beta, runner, before, "raised")
            continue
        _synced(i, a, b, out, c, alpha, beta, runner, before, "returned")
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


def test_out_sharing_memory_with_an_operand_is_refused_and_nothing_is_written():
    """An out that shares a byte with a, b, the bias or (as another view) c
    raises an ArgumentError naming that operand, on the C++ entry and on the
    Python path, before any launch (autotune's timing runs included): the
    operands are left as they were. Disjoint column blocks of one buffer (a
    fused QKV's), and batches of one buffer interleaved through the gaps of
    a padded batch stride, compute correctly."""
    from cutlass_aot.errors import ArgumentError  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    cache_dir = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not cache_dir:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    cache = cutlass_aot.open_cache(cache_dir)
    dt = torch.bfloat16
    for gemm in (cache.gemm, GemmRunner(cache, fast=False).entry()):
        for _ in range(2):  # the second call is the memoized (C++ or Python) hot path
            x = torch.randn(512, 512, device="cuda", dtype=dt)
            w = torch.randn(512, 512, device="cuda", dtype=dt) / 16
            keep = x.clone()
            with pytest.raises(ArgumentError, match="shares memory with a") as info:
                gemm(x, w.t(), x)  # out is a
            assert info.value.reason == "alias"
            torch.cuda.synchronize()
            assert torch.equal(x, keep), "a refused call wrote into out"
            buf = torch.randn(512, 1536, device="cuda", dtype=dt)
            with pytest.raises(ArgumentError, match="shares memory with b"):
                gemm(x, buf[:, :512].t(), buf[:, 256:768])  # out's columns overlap b's rows
            bias = buf[0, 512:1024]
            with pytest.raises(ArgumentError, match="shares memory with bias"):
                gemm(x, w.t(), buf[:, 512:1024], bias=bias)
            c = torch.randn(512, 520, device="cuda", dtype=dt)
            with pytest.raises(ArgumentError, match="shares memory with c"):
                gemm(x, w.t(), c[:, 8:], c=c[:, :512], beta=1.0)
            # With autotune on, a new key's options are timed into out during
            # resolution: the refusal must come before any of them runs.
            tuned = GemmRunner(cache)
            tuned.set_autotune(4)
            y = torch.randn(520, 520, device="cuda", dtype=dt)
            w2 = torch.randn(520, 520, device="cuda", dtype=dt) / 16
            keep_y = y.clone()
            with pytest.raises(ArgumentError, match="shares memory with a"):
                tuned.entry()(y, w2.t(), y)
            torch.cuda.synchronize()
            assert torch.equal(y, keep_y), "autotune's timing runs wrote into a refused out"
            # A fused QKV: the input and the three outputs are blocks of one buffer.
            qkv = torch.full((512, 2048), float("nan"), device="cuda", dtype=dt)
            qkv[:, :512] = x
            ref = x.double() @ w.double().t()
            for j in range(1, 4):
                gemm(qkv[:, :512], w.t(), qkv[:, 512 * j:512 * (j + 1)])
            torch.cuda.synchronize()
            for j in range(1, 4):
                got = qkv[:, 512 * j:512 * (j + 1)].double()
                assert torch.isfinite(got).all()
                assert ((got - ref).norm() / ref.norm()).item() < 1e-2
            # Padded rows and batches with a gap (batch stride past rows x
            # pitch), out's rows in a's row padding (r46): blocks of rows,
            # which both paths walk. out in the padding is served and
            # correct; out over a's last 8 columns is refused.
            L, M, K, N, P = 3, 128, 256, 64, 320
            flat = torch.full((L * 2 * M * P,), float("nan"), device="cuda", dtype=dt)
            a3 = flat.as_strided((L, M, K), (2 * M * P, P, 1))
            a3.copy_(torch.randn(L, M, K, device="cuda", dtype=dt))
            b3 = torch.randn(L, K, N, device="cuda", dtype=dt) / 16
            keep_a3 = a3.clone()
            with pytest.raises(ArgumentError, match="shares memory with a"):
                gemm(a3, b3, flat.as_strided((L, M, N), (2 * M * P, P, 1), K - 8))
            torch.cuda.synchronize()
            assert torch.equal(a3, keep_a3), "a refused batched call wrote into a"
            out3 = flat.as_strided((L, M, N), (2 * M * P, P, 1), K)
            gemm(a3, b3, out3)
            torch.cuda.synchronize()
            ref3 = a3.double() @ b3.double()
            assert torch.isfinite(out3).all() and torch.equal(a3, keep_a3)
            assert ((out3.double() - ref3).norm() / ref3.norm()).item() < 1e-2


def test_in_place_residual_on_every_with_c_schedule():
    """out is c (the same view): every with-C variant, through its raw ABI
    (split-K at an even and an uneven split, and stream-K), adds the
    original C. Each element of C is read before its element of out is
    written in every schedule; this is what check_no_alias relies on."""
    from test_gemm_gpu import _entries, _label, assert_cases_pass, operand, raw_caller  # noqa: PLC0415

    from cutlass_aot.layout import GEMM_SPLITK_ABI  # noqa: PLC0415

    cache_dir = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not cache_dir:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    cache = cutlass_aot.open_cache(cache_dir)
    tol = {"bf16": 2e-2, "f16": 4e-3, "f32": 1e-4}
    dts = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    failures, checked = [], 0
    for e in _entries(cache):
        sig = dict(e.signature.fields)
        if sig["c"] is None or sig["c"] != sig["d"] or sig.get("c_major", sig["d_major"]) != sig["d_major"]:
            continue
        split_k = e.record["abi"] == GEMM_SPLITK_ABI
        for splits in ((2, 3, 0) if split_k else (1,)):
            call = raw_caller(cache, e, splits)
            for m, n, k, nb in ((300, 520, 1032, 1), (1000, 1032, 776, 2)):
                nb = nb if sig["rank"] == 3 else 1
                batch = (nb,) if sig["rank"] == 3 else ()
                _, a = operand(batch, m, k, dts[sig["a"]], sig["a_major"] == "k")
                _, b = operand(batch, k, n, dts[sig["b"]], sig["b_major"] == "n")
                _, c = operand(batch, m, n, dts[sig["d"]], sig["d_major"] == "n")
                bias = torch.randn(n, device="cuda", dtype=dts[sig["bias"]]) if sig.get("bias") else None
                ref = 0.75 * (a.double() @ b.double()) + 1.25 * c.double()
                if bias is not None:
                    ref = ref + bias.double()
                if sig.get("act") not in (None, "none"):
                    continue  # the activation's own checks live in test_gemm_gpu
                call(a, b, c, c, 0.75, 1.25, bias=bias)
                torch.cuda.synchronize()
                checked += 1
                err = ((c.double() - ref).norm() / ref.norm()).item()
                if not torch.isfinite(c).all() or err > tol[sig["d"]]:
                    failures.append(f"{e.signature} {_label(e)} splits={splits} M={m} N={n} K={k} "
                                    f"L={nb}: relative error {err:.2e}")
    if not checked:
        pytest.skip("the cache has no with-C variant")
    assert_cases_pass(failures, checked)
