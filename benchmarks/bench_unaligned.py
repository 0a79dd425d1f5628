"""Unaligned and aligned GEMMs: sm80_gemm (low-alignment) vs cuBLAS vs sm90_gemm.

Run on a GPU machine with a cache built from the manifests for the device
(on an H200: configs/sm90.yaml and configs/sm90-lowalign.yaml):

    CUTLASS_AOT_CACHE_DIR=... python3 benchmarks/bench_unaligned.py [--out FILE]

Part 1, unaligned shapes (K or N not a multiple of 8, so no 16-byte aligned
leading dim and no TMA): nn.Linear layout on contiguous tensors, x[M,K] @
w[N,K].t() -> out[M,N]. For each shape: cuBLAS (torch.mm on the same
tensors), every cached sm80_gemm variant whose signature serves the call
(its align <= the call's alignment, from cutlass_aot.archs.call_alignment),
and the dispatcher's pick (cache.gemm) where it serves the call.
Part 2, aligned llm shapes for the record: cuBLAS, best sm80_gemm, best
sm90_gemm. Ratios are to cuBLAS, re-timed interleaved over 3 rounds (median).

Timing: CUDA events around back-to-back launches after warm-up, median of 5
reps. Inputs from randn.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics

import torch
from _common import header, timed, write

import cutlass_aot
from cutlass_aot.archs import call_alignment, runnable_archs
from cutlass_aot.layout import GEMM_ABI
from cutlass_aot.signature import ARCH_BY_CAPABILITY

UNALIGNED = [
    (777, 4095, 2049), (4097, 129, 8191), (1000, 1000, 1001), (3, 4097, 4097),
    (4095, 4095, 4095), (127, 11007, 4095), (2047, 5121, 1023), (8191, 2049, 4097),
    (2048, 4100, 4098),   # 4-byte aligned rows
    (2048, 4096, 4100),   # 8-byte aligned rows of x and w
]
ALIGNED = [(128, 4096, 4096), (512, 11008, 4096), (4096, 4096, 4096), (2048, 4096, 14336),
           (4096, 11008, 4096), (8192, 8192, 8192)]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}




def label(e) -> str:
    v = e.variant
    if e.record["family"] == "sm80_gemm":
        return f"sm80 a{v['align']} {v['tile']}/{v['warps']}/s{v['stages']}"
    return f"sm90 {v['tile']}/{v['cluster']}/{v['raster']}{v['swizzle']}"


def candidates(cache, dname, align, family, runnable):
    """Entries of `family` serving an nn.Linear call of dtype dname at `align`."""
    out = []
    for sig, entries in cache.by_signature.items():
        f = dict(sig.fields)
        if sig.arch not in runnable or (f["a"], f["b"], f["d"], f["c"], f["rank"],
                                         f["a_major"], f["b_major"], f["d_major"]) != (
                dname, dname, dname, None, 2, "k", "k", "n"):
            continue
        if f["align"] <= align and "bias" not in f and "act" not in f:
            # The plain ABI only: split-K variants take scratch and a split count.
            out += [e for e in entries if e.record["family"] == family and e.record["abi"] == GEMM_ABI]
    return out


def interleaved(ref, fn, flops, iters, rounds=3):
    ratios, tf, tr = [], [], []
    for _ in range(rounds):
        r0 = timed(ref, flops, iters)
        t = timed(fn, flops, iters)
        ratios.append(t / r0)
        tf.append(t)
        tr.append(r0)
    return statistics.median(ratios), statistics.median(tf), statistics.median(tr)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--skip-aligned", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    cache = cutlass_aot.open_cache(args.cache_dir)
    device_arch = ARCH_BY_CAPABILITY[torch.cuda.get_device_capability()]
    runnable = runnable_archs(device_arch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    un_lines, al_lines, summary = [], [], []
    for dname in args.dtypes.split(","):
        dt = DTYPES[dname]
        best_ratios, pick_ratios = [], []
        for m, n, k in UNALIGNED:
            a = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt)
            b = w.t()
            out = torch.empty(m, n, device="cuda", dtype=dt)
            align = call_alignment([(t.data_ptr(), t.stride(), t.element_size()) for t in (a, b, out)])
            flops = 2.0 * m * n * k
            iters = max(3, min(200, int(2e12 / flops)))
            ref = functools.partial(torch.mm, a, b, out=out)
            t_ref = timed(ref, flops, iters)
            cands = candidates(cache, dname, align, "sm80_gemm", runnable)
            if not cands:
                un_lines.append(f"| {dname} | {m}x{n}x{k} | {align} | {t_ref:.0f} | no variant | | | |")
                print(un_lines[-1], flush=True)
                continue
            results = {}
            for e in cands:
                fn = cache.function(e.key)
                results[e.key] = timed(functools.partial(fn, a, b, out, 1.0, sms), flops, iters)
            best = max(results, key=results.get)
            fbest = cache.function(best)
            rb, tb, t_ref = interleaved(ref, functools.partial(fbest, a, b, out, 1.0, sms), flops, iters)
            best_ratios.append(rb)
            try:
                cache.gemm(a, b, out=out)
                rp, tp, _ = interleaved(ref, functools.partial(cache.gemm, a, b, out=out), flops, iters)
                pick_ratios.append(rp)
                pick = f"{tp:.0f} | {rp:.2f}"
            except Exception as exc:  # noqa: BLE001 - the dispatcher may not route this yet
                pick = f"n/a ({type(exc).__name__}) |"
            un_lines.append(f"| {dname} | {m}x{n}x{k} | {align} | {t_ref:.0f} | {tb:.0f} "
                            f"({label(cache.entries[best])}) | {rb:.2f} | {pick} |")
            print(un_lines[-1], flush=True)
        summary.append(f"| {dname} | unaligned | best sm80 / cuBLAS | {geomean(best_ratios):.3f} |")
        if pick_ratios:
            summary.append(f"| {dname} | unaligned | dispatcher / cuBLAS | {geomean(pick_ratios):.3f} |")
        if args.skip_aligned:
            continue
        r80s, r90s = [], []
        for m, n, k in ALIGNED:
            a = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt)
            b = w.t()
            out = torch.empty(m, n, device="cuda", dtype=dt)
            flops = 2.0 * m * n * k
            iters = max(3, min(200, int(2e12 / flops)))
            ref = functools.partial(torch.mm, a, b, out=out)
            t_ref = timed(ref, flops, iters)
            cells = []
            for family, ratios in (("sm80_gemm", r80s), ("sm90_gemm", r90s)):
                cands = candidates(cache, dname, 16, family, runnable)
                if not cands:
                    cells.append("no variant | ")
                    continue
                res = {e.key: timed(functools.partial(cache.function(e.key), a, b, out, 1.0, sms), flops, iters)
                       for e in cands}
                best = max(res, key=res.get)
                fb = cache.function(best)
                r, t, t_ref = interleaved(ref, functools.partial(fb, a, b, out, 1.0, sms), flops, iters)
                ratios.append(r)
                cells.append(f"{t:.0f} ({label(cache.entries[best])}) | {r:.2f}")
            al_lines.append(f"| {dname} | {m}x{n}x{k} | {t_ref:.0f} | {cells[0]} | {cells[1]} |")
            print(al_lines[-1], flush=True)
        summary.append(f"| {dname} | aligned | best sm80 / cuBLAS | {geomean(r80s):.3f} |")
        summary.append(f"| {dname} | aligned | best sm90 / cuBLAS | {geomean(r90s):.3f} |")

    text = header("Unaligned GEMMs: sm80_gemm low-alignment variants vs cuBLAS (and sm90_gemm, aligned)")
    text += (f"Device arch {device_arch}; entries of archs {', '.join(runnable)} are eligible. "
             "nn.Linear layout on contiguous tensors: x[M,K] @ w[N,K].t() -> out[M,N]. "
             "`align` is the call's alignment in bytes (cutlass_aot.archs.call_alignment). "
             "TFLOP/s from CUDA events, median of 5 reps; ratios to cuBLAS (torch.mm on the same "
             "tensors) re-timed interleaved, median of 3 rounds.\n\n")
    text += "## Unaligned shapes\n\n| dtype | MxNxK | align | cuBLAS TFLOP/s | best sm80 TFLOP/s (variant) " \
            "| best/cuBLAS | dispatcher TFLOP/s | dispatcher/cuBLAS |\n|---|---|---|---|---|---|---|---|\n"
    text += "\n".join(un_lines) + "\n\n"
    if al_lines:
        text += "## Aligned llm shapes (for the record: mma.sync has no wgmma)\n\n| dtype | MxNxK | " \
                "cuBLAS TFLOP/s | best sm80 TFLOP/s (variant) | sm80/cuBLAS | best sm90 TFLOP/s " \
                "(variant) | sm90/cuBLAS |\n|---|---|---|---|---|---|---|\n"
        text += "\n".join(al_lines) + "\n\n"
    text += "## Geometric means\n\n| dtype | shapes | ratio | geomean |\n|---|---|---|---|\n"
    text += "\n".join(summary) + "\n"
    day = __import__("datetime").date.today().isoformat()
    path = write(f"{day}_h200_unaligned.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
