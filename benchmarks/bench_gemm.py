"""Device throughput of cached GEMMs against cuBLAS (torch.mm) in one process.

For each shape of shapes.yaml (D[M,N] = A[M,K] @ B[K,N], A row-major, B as
w.t() of a row-major weight, the nn.Linear layout) and each dtype, times
every cached variant of the signature, the variant the dispatcher's
heuristic picks, and torch.mm / torch.bmm. Prints TFLOP/s, the ratio to
cuBLAS per shape (best variant and heuristic pick) and the geometric mean
per group; writes the table to benchmarks/results/ (or --out).

Timing: CUDA events around `iters` back-to-back launches, after warm-up,
median of `reps`; inputs drawn from randn (never zeros).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from pathlib import Path

import torch
import yaml
from _common import header, timed, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import launch_choice

HERE = Path(__file__).resolve().parent






def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--shapes", default=str(HERE / "shapes.yaml"))
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    cache = cutlass_aot.open_cache(args.cache_dir)
    groups = yaml.safe_load(Path(args.shapes).read_text())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch_dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    lines = []
    summary = []
    for dname in args.dtypes.split(","):
        dt = torch_dt[dname]
        for group, shapes in groups.items():
            ratios_best, ratios_pick = [], []
            for shape in shapes:
                batch, (m, n, k) = (shape[0], shape[1:]) if len(shape) == 4 else (1, shape)
                rank = 3 if len(shape) == 4 else 2
                if rank == 2:
                    a = torch.randn(m, k, device="cuda", dtype=dt)
                    w = torch.randn(n, k, device="cuda", dtype=dt)
                    b = w.t()
                    out = torch.empty(m, n, device="cuda", dtype=dt)
                    ref = lambda: torch.mm(a, b, out=out)  # noqa: E731
                else:
                    a = torch.randn(batch, m, k, device="cuda", dtype=dt)
                    w = torch.randn(batch, n, k, device="cuda", dtype=dt)
                    b = w.transpose(1, 2)
                    out = torch.empty(batch, m, n, device="cuda", dtype=dt)
                    ref = lambda: torch.bmm(a, b, out=out)  # noqa: E731
                flops = 2.0 * m * n * k * batch
                iters = max(3, min(200, int(2e12 / flops)))
                t_ref0 = timed(ref, flops, iters)
                sig_entries = None
                for sig, entries in cache.by_signature.items():
                    f = dict(sig.fields)
                    if sig.arch == "sm_90a" and (f["a"], f["a_major"], f["b_major"], f["d"], f["c"],
                            f["rank"], f["align"], f.get("bias"), f.get("act")) == (
                            dname, "k", "k", dname, None, rank, 16, None, None):
                        sig_entries = entries
                if not sig_entries:
                    lines.append(f"| {group} | {dname} | {shape} | {t_ref0:.0f} | no variant | | | |")
                    continue
                sig = sig_entries[0].signature
                cands = cache.gemm.runner._candidates_for(sig)
                options = [select.Choice(c, s, "bench") for c in cands
                           for s in select.split_choices(c, m, n, k, batch, sms)]
                # Bound the run: the model's 16 best options (and the pick) are timed.
                options.sort(key=lambda o: select.estimate_us(o.candidate, o.splits, m, n, k, batch, sms))
                options = options[:16]
                fns = {o.label(): launch_choice(cache, o, sms, m, n, batch, k=k) for o in options}
                results = {lab: timed(lambda f=f: f(a, b, out), flops, iters) for lab, f in fns.items()}
                choice = cache.gemm.runner.choice_for(a, b, out)
                pick = choice.label()
                best = max(results, key=results.get)
                # Clocks drift over the seconds a shape takes: re-time cuBLAS,
                # the best and the picked variant interleaved, three rounds,
                # and report the median of each round's ratio.
                rbs, rps, bests, picks, refs = [], [], [], [], []
                for _ in range(3):
                    r0 = timed(ref, flops, iters)
                    tb = timed(lambda f=fns[best]: f(a, b, out), flops, iters)
                    tp = timed(lambda: cache.gemm(a, b, out), flops, iters)
                    rbs.append(tb / r0)
                    rps.append(tp / r0)
                    bests.append(tb)
                    picks.append(tp)
                    refs.append(r0)
                rb, rp = statistics.median(rbs), statistics.median(rps)
                t_ref = statistics.median(refs)
                results[best], results[pick] = statistics.median(bests), statistics.median(picks)
                ratios_best.append(rb)
                ratios_pick.append(rp)
                lines.append(f"| {group} | {dname} | {'x'.join(map(str, shape))} | {t_ref:.0f} | "
                             f"{results[best]:.0f} ({best}) | {rb:.2f} | {pick} | {rp:.2f} |")
                print(lines[-1], flush=True)
            if ratios_best:
                gb = math.exp(sum(map(math.log, ratios_best)) / len(ratios_best))
                gp = math.exp(sum(map(math.log, ratios_pick)) / len(ratios_pick))
                summary.append(f"| {group} | {dname} | {gb:.3f} | {gp:.3f} | {min(ratios_best):.2f} |")
    text = header("GEMM throughput vs cuBLAS (torch.mm), same process")
    text += ("A row-major [M,K], B = w.t() of a row-major [N,K] weight, D row-major, fp32 accumulate.\n"
             "TFLOP/s from CUDA events, median of 5 reps. Every cached variant is timed once to find "
             "'best' (the fastest); then cuBLAS, 'best' and 'pick' (the dispatcher's choice) are "
             "re-timed interleaved for 3 rounds and each ratio is the median over rounds "
             "(clocks drift over a shape's seconds). 'best' = fastest cached variant; "
             "'pick' = the dispatcher's choice (cache.gemm, timed through the dispatcher: table row or model).\n\n")
    text += ("| group | dtype | shape (MxNxK or LxMxNxK) | cuBLAS TFLOP/s | best TFLOP/s (variant) "
             "| best/cuBLAS | pick | pick/cuBLAS |\n|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n\n## Geometric mean of ratios per group\n\n"
    text += "| group | dtype | geomean best/cuBLAS | geomean pick/cuBLAS | min best/cuBLAS |\n|---|---|---|---|---|\n"
    text += "\n".join(summary) + "\n"
    print(text)
    path = write("gemm_vs_cublas.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
