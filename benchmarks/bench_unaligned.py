"""Unaligned GEMMs: the dispatcher (staged TMA route) vs the low-alignment family vs cuBLAS.

Run on a GPU machine with a cache built from the manifests for the device
(on an H200: configs/sm90.yaml and configs/sm90-lowalign.yaml):

    CUTLASS_AOT_CACHE_DIR=... python3 benchmarks/bench_unaligned.py [--out FILE]

nn.Linear layout on contiguous tensors, x[M,K] @ w[N,K].t() -> out[M,N],
with K or N not a multiple of 8 (no 16-byte leading dim, so no TMA on the
tensors as given), or views starting 2 bytes into their storage. Per shape:

* cuBLAS: torch.mm on the same tensors;
* pick: the dispatcher (cache.gemm), which serves such calls with the
  16-byte variants *staged* (misaligned operands copied into 16-byte pitched
  scratch, out copied back: run/dispatch.py);
* pick, pre-aligned: the same dispatcher call on 16-byte pitched copies made
  beforehand (the staged route minus its copies: what the copies cost);
* native: the fastest cached sm80_gemm low-alignment variant that serves the
  call (align <= the call's alignment), launched directly.

Two shape sets: the issue's list (``suite``) and a seeded random sample
(``random``, seed 3003: M log-uniform over 1..16384, N and K log-uniform
over 96..16384 with at least one of them odd), which no rule here was fitted
to. Part 2, aligned llm shapes for the record: cuBLAS, best sm80_gemm, best
sm90_gemm. Ratios are to cuBLAS, re-timed interleaved over 3 rounds (median).

Timing: CUDA events around back-to-back launches after warm-up, median of 5
reps. Inputs from randn.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import time

import torch
from _common import header, timed, write

import cutlass_aot
from cutlass_aot.archs import runnable_archs, tensor_alignment
from cutlass_aot.layout import GEMM_ABI
from cutlass_aot.run import pitch
from cutlass_aot.signature import ARCH_BY_CAPABILITY
from cutlass_aot.tune.timing import time_us

UNALIGNED = [
    (777, 4095, 2049), (4097, 129, 8191), (1000, 1000, 1001), (3, 4097, 4097),
    (4095, 4095, 4095), (127, 11007, 4095), (2047, 5121, 1023), (8191, 2049, 4097),
    (2048, 4100, 4098),   # 4-byte aligned rows
    (2048, 4096, 4100),   # 8-byte aligned rows of x and w
]
# Views starting 2 bytes into their storage (aligned extents, misaligned pointer).
OFFSET = [(4096, 4096, 4096), (1, 4096, 14336)]
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


SEEDS = {"fit": 3004, "heldout": 3003}


def random_sample(count: int, seed: int) -> list[tuple[int, int, int]]:
    """M log-uniform over 1..16384; N, K log-uniform over 96..16384, not both multiples of 8."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        m = max(1, round(2 ** rng.uniform(0, 14)))
        n, k = (max(96, round(2 ** rng.uniform(math.log2(96), 14))) for _ in range(2))
        if n % 8 == 0 and k % 8 == 0:
            k += rng.choice((1, 2, 3, 4, 5, 6, 7))
        out.append((m, n, k))
    return out


def measure(cache, dname, m, n, k, offset, runnable, sms) -> dict:
    """One unaligned shape, timed every way; times in microseconds."""
    dt = DTYPES[dname]
    if offset:
        a = torch.randn(m * k + offset, device="cuda", dtype=dt)[offset:].view(m, k)
    else:
        a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    b = w.t()
    out = torch.empty(m, n, device="cuda", dtype=dt)
    aligns = {name: tensor_alignment(t.data_ptr(), t.stride(), t.element_size())
              for name, t in (("a", a), ("b", b), ("out", out))}
    align = min(aligns.values())
    flops = 2.0 * m * n * k
    iters = max(3, min(200, int(2e12 / flops)))
    ref = functools.partial(torch.mm, a, b, out=out)
    call = functools.partial(cache.gemm, a, b, out=out)
    runner = cache.gemm.runner
    runner.set_unaligned("staged")
    call()
    rs, ts, _ = interleaved(ref, call, flops, iters)
    runner.set_unaligned("auto")
    call()
    choice = runner.choice_for(a, b, out).label()
    rp, tp, t_ref = interleaved(ref, call, flops, iters)
    # Device time alone (a service replaying CUDA graphs pays no host cost).
    g_ref, g_pick = (time_us(fn, reps=3, graph=True) for fn in (ref, call))
    # 16-byte pitched copies, as the staged route makes them.
    a16, w16, o16 = (pitch.pitched_like(t).copy_(t) for t in (a, w, out))
    cache.gemm(a16, w16.t(), out=o16)
    t_pre = timed(functools.partial(cache.gemm, a16, w16.t(), out=o16), flops, iters)
    rec = {"dtype": dname, "m": m, "n": n, "k": k, "offset_bytes": offset * a.element_size(),
           "align": align, "staged": sorted(n_ for n_, al in aligns.items() if al < 16),
           "pick": choice, "cublas_us": flops / t_ref / 1e6, "pick_us": flops / tp / 1e6,
           "pick_ratio": rp, "staged_us": flops / ts / 1e6, "staged_ratio": rs,
           "cublas_graph_us": g_ref, "pick_graph_us": g_pick,
           "pre_aligned_us": flops / t_pre / 1e6, "native_us": {}}
    cands = candidates(cache, dname, align, "sm80_gemm", runnable)
    if cands:
        results = {e.key: timed(functools.partial(cache.function(e.key), a, b, out, 1.0, sms), flops, iters)
                   for e in cands}
        rec["native_us"] = {e.key: flops / results[e.key] / 1e6 for e in cands}
        best = max(results, key=results.get)
        rn, tn, _ = interleaved(ref, functools.partial(cache.function(best), a, b, out, 1.0, sms),
                                flops, iters)
        rec.update(native_best=best, native_label=label(cache.entries[best]), native_ratio=rn,
                   native_best_us=flops / tn / 1e6)
    return rec


def row(rec: dict) -> str:
    us = lambda t: f"{t:.1f}"  # noqa: E731
    shape = f"{rec['m']}x{rec['n']}x{rec['k']}" + (f" +{rec['offset_bytes']}B" if rec["offset_bytes"] else "")
    native = "no variant | |"
    if "native_best" in rec:
        native = f"{us(rec['native_best_us'])} ({rec['native_label']}) | {rec['native_ratio']:.2f}"
    return (f"| {rec['dtype']} | {shape} | {rec['align']} | {','.join(rec['staged'])} | {us(rec['cublas_us'])} "
            f"| {us(rec['pick_us'])} ({rec['pick']}) | {rec['pick_ratio']:.2f} | {us(rec['staged_us'])} "
            f"| {rec['staged_ratio']:.2f} | {us(rec['pre_aligned_us'])} | {native} "
            f"| {us(rec['cublas_graph_us'])} | {us(rec['pick_graph_us'])} "
            f"| {rec['cublas_graph_us'] / rec['pick_graph_us']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtypes", default="bf16,f16", help="dtypes of the issue's shapes")
    ap.add_argument("--samples", default="suite,heldout",
                    help="comma list of suite (the issue's shapes), fit, heldout (seeded random samples)")
    ap.add_argument("--random", type=int, default=32, help="size of each seeded random sample")
    ap.add_argument("--random-dtypes", default="bf16")
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop starting new shapes after this")
    ap.add_argument("--skip-aligned", action="store_true")
    ap.add_argument("--raw", default=None, help="write every record as JSON here")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    start = time.monotonic()
    cache = cutlass_aot.open_cache(args.cache_dir)
    device_arch = ARCH_BY_CAPABILITY[torch.cuda.get_device_capability()]
    runnable = runnable_archs(device_arch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    samples = args.samples.split(",")
    al_lines, summary, records = [], [], []
    plan = []
    if "suite" in samples:
        plan += [("suite", d, shape, 0) for d in args.dtypes.split(",") for shape in UNALIGNED]
        plan += [("suite", d, shape, 1) for d in args.dtypes.split(",") for shape in OFFSET]
    for part in ("fit", "heldout"):
        if part in samples:
            plan += [(part, d, shape, 0) for d in args.random_dtypes.split(",")
                     for shape in random_sample(args.random, SEEDS[part])]
    for part, dname, (m, n, k), offset in plan:
        if time.monotonic() - start > args.budget_s:
            break
        rec = measure(cache, dname, m, n, k, offset, runnable, sms)
        rec["sample"] = part
        records.append(rec)
        print(row(rec), flush=True)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(records, f)
    for part in dict.fromkeys(r["sample"] for r in records):
        for dname in dict.fromkeys(r["dtype"] for r in records):
            recs = [r for r in records if (r["sample"], r["dtype"]) == (part, dname)]
            if not recs:
                continue
            picks = [r["pick_ratio"] for r in recs]
            summary.append(f"| {dname} | {part} ({len(recs)} shapes) | dispatcher / cuBLAS | "
                           f"{geomean(picks):.3f} (min {min(picks):.2f}) |")
            graph = [r["cublas_graph_us"] / r["pick_graph_us"] for r in recs]
            summary.append(f"| {dname} | {part} ({len(recs)} shapes) | dispatcher / cuBLAS, CUDA graph "
                           f"replay | {geomean(graph):.3f} (min {min(graph):.2f}) |")
            staged = [r["staged_ratio"] for r in recs]
            summary.append(f"| {dname} | {part} ({len(recs)} shapes) | staged route / cuBLAS | "
                           f"{geomean(staged):.3f} (min {min(staged):.2f}) |")
            natives = [r["native_ratio"] for r in recs if "native_ratio" in r]
            if natives:
                summary.append(f"| {dname} | {part} ({len(natives)} shapes) | best native low-alignment "
                               f"/ cuBLAS | {geomean(natives):.3f} |")
    if len(records) < len(plan):
        summary.append(f"| | | budget ended after {len(records)} of {len(plan)} shapes | |")
    for dname in ([] if args.skip_aligned else args.dtypes.split(",")):
        if time.monotonic() - start > args.budget_s:
            break
        dt = DTYPES[dname]
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
            for family, acc in (("sm80_gemm", r80s), ("sm90_gemm", r90s)):
                cands = candidates(cache, dname, 16, family, runnable)
                if not cands:
                    cells.append("no variant | ")
                    continue
                res = {e.key: timed(functools.partial(cache.function(e.key), a, b, out, 1.0, sms), flops, iters)
                       for e in cands}
                best = max(res, key=res.get)
                fb = cache.function(best)
                r, t, t_ref = interleaved(ref, functools.partial(fb, a, b, out, 1.0, sms), flops, iters)
                acc.append(r)
                cells.append(f"{t:.0f} ({label(cache.entries[best])}) | {r:.2f}")
            al_lines.append(f"| {dname} | {m}x{n}x{k} | {t_ref:.0f} | {cells[0]} | {cells[1]} |")
            print(al_lines[-1], flush=True)
        summary.append(f"| {dname} | aligned | best sm80 / cuBLAS | {geomean(r80s):.3f} |")
        summary.append(f"| {dname} | aligned | best sm90 / cuBLAS | {geomean(r90s):.3f} |")

    text = header("Unaligned GEMMs: the dispatcher's staged route vs the low-alignment family vs cuBLAS")
    text += (f"Device arch {device_arch}; entries of archs {', '.join(runnable)} are eligible. "
             "nn.Linear layout: x[M,K] @ w[N,K].t() -> out[M,N]; `+2B`: x is a view starting 2 bytes "
             "into its storage. `align` is the call's alignment in bytes "
             "(cutlass_aot.archs.call_alignment). Times (µs) from CUDA events, median of 5 reps; ratios to "
             "cuBLAS (torch.mm on the same tensors) re-timed interleaved, median of 3 rounds. "
             "`misaligned`: the operands below 16-byte alignment. `pick`: the dispatcher's route under "
             "CUTLASS_AOT_UNALIGNED=auto (`staged:` the 16-byte variant through aligned copies, else a "
             "low-alignment variant). `staged`: the dispatcher forced to the staged route. "
             "`pre-aligned`: the dispatcher on 16-byte pitched copies made beforehand (the staged "
             "route without its copies). `native`: the fastest sm80_gemm low-alignment variant "
             "serving the call, launched directly. `graph`: the same calls captured in a CUDA graph and "
             "replayed (device time only, as a service replaying graphs sees it; cutlass_aot.tune."
             "timing.time_us).\n\n")
    cols = ("| dtype | MxNxK | align | misaligned | cuBLAS µs | pick µs (route) | pick/cuBLAS | "
            "staged µs | staged/cuBLAS | pre-aligned µs | native µs (variant) | native/cuBLAS | "
            "cuBLAS graph µs | pick graph µs | pick/cuBLAS, graph |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    titles = {"suite": "The issue's shapes", "fit": f"Seeded random sample `fit` (seed {SEEDS['fit']})",
              "heldout": f"Seeded random sample `heldout` (seed {SEEDS['heldout']}; never fitted to)"}
    for part in dict.fromkeys(r["sample"] for r in records):
        text += f"## {titles[part]}\n\n" + cols + "\n".join(row(r) for r in records if r["sample"] == part)
        text += "\n\n"
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
