"""Selection and kernel coverage on seeded random shapes, against cuBLAS, in one process.

For each shape of a seeded random sample (nn.Linear layout: A row-major
[M,K], B = W.t(), D row-major; M log-uniform over 1..65536, N and K
multiples of 8 log-uniform over 256..57344, extremes included), and each
dtype, this times every (variant, split count) option of the signature in
the cache, cuBLAS (torch.mm), and reports:

* best / cuBLAS: the fastest option in the cache against cuBLAS;
* regret = time(pick) / time(best) for the dispatcher's modes: ``table``
  (the cache's selection table, shapes it measured) and ``model`` (no
  table: the analytic model alone);
* pick / cuBLAS for the dispatcher as it runs (the table's row, else the model);
* per shape class (decode M <= 128, narrow N <= 1024, short K <= 512,
  large >= 1e12 flop, other), and the worst shapes with their picks.

Samples: ``--sample fit`` (seed 1001) is what the model's constants were
fitted on; ``--sample fit2`` (seed 3003, r32) is more of the same kind, for
a term the first cannot pin down (fit-side data: fitted on like ``fit``);
``--sample heldout`` (seed 2002) is never used for fitting or
tuning; ``--sample table`` times the problems of the cache's table itself.
Timing: tune.timing with graph=True (device time, cold L2: operand sets
rotated call to call, ``tune.timing.L2_POLICY``); best, picks and
cuBLAS are then re-timed interleaved (3 rounds) and ratios use those.
Shapes above ``--max-gflop`` are redrawn (bounds the run; stated in the
output). ``--raw FILE`` saves every option's time (for fitting the model).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import best_vs, drift_lines, header, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import (
    L2_POLICY,
    STEADY_MIN_US,
    cold_operands,
    interleaved,
    rotate,
    steady_for,
    time_us,
)

SEEDS = {"fit": 1001, "heldout": 2002, "fit2": 3003}
MAX_GFLOP = 20000.0  # --max-gflop's default: larger shapes are redrawn
DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def sample(seed: int, count: int, max_gflop: float) -> list[tuple[int, int, int]]:
    """A seeded random shape sample (module docstring); the first few are extremes."""
    rng = random.Random(seed)
    lo, hi = 256, 57344

    def dim():
        return max(lo, min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi)))) // 8 * 8))

    out: list[tuple[int, int, int]] = []
    extremes = [(1, hi, lo), (65536, lo, lo), (1, lo, hi), (8, 4096, hi), (65536, 256, 4096),
                (2, hi, 1024), (16384, 512, 16384), (128, lo, hi)]
    for m, n, k in extremes:
        if 2 * m * n * k <= max_gflop * 1e9:
            out.append((m, n, k))
    while len(out) < count:
        m = int(math.exp(rng.uniform(0, math.log(65536))))
        n, k = dim(), dim()
        if 2 * m * n * k > max_gflop * 1e9:
            continue
        out.append((max(1, m), n, k))
    return out[:count]


def shape_class(m: int, n: int, k: int) -> str:
    if m <= 128:
        return "decode"
    if n <= 1024:
        return "narrow_n"
    if k <= 512:
        return "short_k"
    if 2 * m * n * k >= 1e12:
        return "large"
    return "other"


def gmean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def bounded(options: list, est: dict, m: int, n: int, k: int) -> list:
    """The options timed at one shape: all of them, or above 2 TFLOP the
    model's 16 best by estimate, plus the long-K order's 1x2 256-row walks
    where it applies (select.longk_rank), which the estimate ranks out: r53
    found the sweeps had never timed them at the shapes where they win."""
    if 2 * m * n * k <= 2e12 or len(options) <= 16:
        return options
    kept = sorted(options, key=est.get)[:16]
    return kept + [o for o in options if o not in kept and select.longk_walk(o.candidate, m, n, k, 1)]


class _Cut(Exception):
    """SIGTERM arrived: stop timing, report what was measured."""


def _on_sigterm(signum, frame):
    raise _Cut


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--sample", choices=["fit", "fit2", "heldout", "table"], default="heldout")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--max-gflop", type=float, default=MAX_GFLOP)
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--start", type=int, default=0,
                    help="skip the sample's first N shapes (per dtype; the table's in sorted order): "
                         "continue a run its budget ended")
    ap.add_argument("--max-m", type=int, default=None,
                    help="keep only the sample's shapes with M <= this (the sample itself is unchanged)")
    ap.add_argument("--min-m", type=int, default=None,
                    help="keep only the sample's shapes with M >= this (with --max-m: a band of M)")
    ap.add_argument("--min-k", type=int, default=None,
                    help="only the sample's shapes with K at least this (the long-K ones)")
    ap.add_argument("--autotune", type=int, default=6,
                    help="also report dispatch with autotune timing this many options (0: off)")
    ap.add_argument("--steady-ms", type=float, default=0.0,
                    help="a shape whose fastest screened option takes 1 ms or more: cuBLAS, the "
                         "best option and each mode's pick are re-timed each after this many ms "
                         "back to back (tune.timing's steady_ms: the power cap's clock; r54)")
    ap.add_argument("--raw", default=None, help="write every option's time here (JSON)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not (args.steady_ms >= 0 and math.isfinite(args.steady_ms)):
        ap.error(f"--steady-ms must be a finite number of ms, 0 or more; got {args.steady_ms}")

    cache = cutlass_aot.open_cache(args.cache_dir)
    runner = cache.gemm.runner
    arch, sms, gpu_name, cc = device_info(0)
    start = time.monotonic()
    raw, lines = [], []
    # The step limit (`timeout`) ends a run with SIGTERM: what was measured is
    # still reported, with where to continue (r62 lost a report to a heavy last pair).
    at = {"dtype": None, "next": args.start}
    cut = None
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for dname in args.dtypes.split(","):
            sig = gemm_signature(arch, a=dname, b=dname, d=dname, c=None, a_major="k", b_major="k",
                                 d_major="n", rank=2)
            cands = runner._candidates_for(sig)
            rows = cache.table_rows(sig, gpu_name, sms, cc) or {}
            if args.sample == "table":
                shapes = sorted({(m, n, k) for (m, n, k, batch) in rows if batch == 1})
            else:
                shapes = sample(SEEDS[args.sample], args.count, args.max_gflop)
            # Before --start: it counts the shapes kept.
            if args.max_m is not None:
                shapes = [s for s in shapes if s[0] <= args.max_m]
            if args.min_m is not None:
                shapes = [s for s in shapes if s[0] >= args.min_m]
            if args.min_k is not None:
                shapes = [s for s in shapes if s[2] >= args.min_k]
            shapes = shapes[args.start:]
            for idx, (m, n, k) in enumerate(shapes):
                at.update(dtype=dname, next=args.start + idx)
                if args.budget_s and time.monotonic() - start > args.budget_s:
                    print(f"budget reached after {idx} shapes of {dname} (continue with --start "
                          f"{args.start + idx})", file=sys.stderr)
                    break
                # Operand sets rotated call to call: every call reads cold (L2_POLICY).
                sets = cold_operands((dname, dname, dname, "k", "k", "n", 2), m, n, k, 1)
                a, b, out = sets[0]
                options = [select.Choice(c, s, "bench") for c in cands
                           for s in select.split_choices(c, m, n, k, 1, sms)]
                est = {o: select.estimate_us(o.candidate, o.splits, m, n, k, 1, sms) for o in options}
                options = bounded(options, est, m, n, k)
                fns = {o: launch_choice(cache, o, sms, m, n, 1, k=k) for o in options}
                times = {o: time_us(rotate(fns[o], sets), reps=3, rep_us=150, graph=True) for o in options}
                ref = rotate(lambda a, b, out: torch.mm(a, b, out=out), sets)
                best = min(times, key=times.get)
                modes = {"model": select.model_choice(cands, m, n, k, 1, sms)}
                if rows:
                    modes["dispatch"] = select.choose(cands, m, n, k, 1, sms, rows)
                if args.autotune:
                    # The runner's own path: a first call times the model's
                    # leading options on these operands (run/autotune.py).
                    runner.set_autotune(args.autotune)
                    modes["autotune"] = runner.choice_for(a, b, out)
                    runner.set_autotune(0)
                # Every mode's pick is re-timed with the best and cuBLAS,
                # interleaved (an autotuned pick outside the timed options too).
                picks = {}
                for mode, ch in modes.items():
                    p = next((o for o in options if o.candidate == ch.candidate
                              and o.splits == ch.splits), None)
                    if p is None:
                        p = select.Choice(ch.candidate, ch.splits, "bench")
                        fns[p] = launch_choice(cache, p, sms, m, n, 1, k=k)
                    picks[mode] = p
                retime = [best] + [p for p in picks.values() if p is not None and p != best]
                # a heavy shape under --steady-ms: every re-timed function, cuBLAS
                # too, gets the warm-up (steady_min_us=0: none stays a burst)
                steady = steady_for(args.steady_ms, min(times.values()))
                again = interleaved([ref] + [rotate(fns[o], sets) for o in retime], graph=True,
                                    steady_ms=steady, steady_min_us=0.0)
                t_ref, t_opt = again[0], dict(zip(retime, again[1:]))
                fastest = min(t_opt, key=t_opt.get)
                t_best = t_opt[fastest]
                rec = {"dtype": dname, "m": m, "n": n, "k": k, "cublas_us": t_ref,
                       "best": best.label(), "best_us": t_opt[best],
                       # the fastest option as re-timed: under --steady-ms the
                       # screen's best (a burst figure) can lose to a pick
                       "fastest": fastest.label(), "fastest_us": t_best,
                       "options": [[o.label(), o.candidate.key, o.splits, times[o], est[o]] for o in options],
                       "class": shape_class(m, n, k), "l2": L2_POLICY,
                       "steady_ms": steady}
                for mode, ch in modes.items():
                    p = picks[mode]
                    t = t_opt[p] if p is not None else float("nan")
                    rec[mode] = {"pick": ch.label(), "source": ch.source, "us": t,
                                 "regret": t / t_best, "vs_cublas": t_ref / t}
                raw.append(rec)
                if args.raw:  # after every shape: a run cut short keeps what it measured
                    Path(args.raw).write_text(json.dumps(raw))
                line = (f"| {dname} | {m}x{n}x{k} | {rec['class']} | {t_ref:.1f} | {t_best:.1f} | "
                        f"{fastest.label()} | {t_ref / t_best:.2f} | {rec['model']['pick']} | "
                        f"{rec['model']['regret']:.3f} |")
                for mode in ("dispatch", "autotune"):
                    if mode in rec:
                        line += f" {rec[mode]['pick']} ({rec[mode]['source']}) | {rec[mode]['regret']:.3f} |"
                lines.append(line)
                print(line, flush=True)
    except _Cut:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        cut = (f"cut short by SIGTERM (the step limit) while timing {at['dtype']} shape "
               f"{at['next']} (continue with --dtypes {at['dtype']} --start {at['next']})")
        print(cut, file=sys.stderr)
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw))

    def dist(xs):
        xs = sorted(x for x in xs if x == x)
        if not xs:
            return "n/a"
        return (f"median {statistics.median(xs):.3f}, p90 {xs[int(0.9 * (len(xs) - 1))]:.3f}, "
                f"worst {xs[-1]:.3f} (n={len(xs)})")

    text = header(f"Selection on a seeded random sample ({args.sample}), against cuBLAS")
    start = f" from shape {args.start}" if args.start else ""
    if args.max_m is not None:
        start += f", only M <= {args.max_m}"
    if args.min_m is not None:
        start += f", only M >= {args.min_m}"
    if args.min_k is not None:
        start += f", only K >= {args.min_k}"
    text += (f"Sample: {args.sample} (seed {SEEDS.get(args.sample, 'table rows')}){start}, {len(raw)} "
             f"(shape, dtype) pairs, nn.Linear layout; shapes above {args.max_gflop:.0f} GFLOP "
             f"redrawn. Device time (CUDA graph replay, {L2_POLICY} L2: operand sets rotated call "
             "to call, tune.timing); best, picks and cuBLAS re-timed "
             "interleaved, 3 rounds. Above 2 TFLOP, only the model's 16 best options are timed "
             "(since r54 with the long-K order's 1x2 256-row walks where it applies)"
             + (f"; **{cut}**" if cut else "")
             + (f"; shapes whose fastest screened option took {STEADY_MIN_US:g} µs or more "
                f"({sum(1 for r in raw if r.get('steady_ms'))} here) had the re-timing run each "
                f"function {args.steady_ms:g} ms back to back first (the power cap's clock)"
                if args.steady_ms else "") + ".\n\n")
    text += "## Summary\n\n"
    for mode in ("model", "dispatch", "autotune"):
        got = [r for r in raw if mode in r]
        if not got:
            continue
        by_src: dict[str, list] = {}
        for r in got:
            by_src.setdefault(r[mode]["source"], []).append(r[mode]["regret"])
        text += f"- regret, {mode} mode: {dist([r[mode]['regret'] for r in got])}\n"
        for src, xs in sorted(by_src.items()):
            text += f"  - picked by {src}: {dist(xs)}\n"
        text += f"- pick / cuBLAS ({mode}): geomean {gmean([r[mode]['vs_cublas'] for r in got]):.3f}\n"
    text += (f"- best cached / cuBLAS (the fastest option as re-timed): geomean "
             f"{gmean([best_vs(r) for r in raw]):.3f}, "
             f"min {min((best_vs(r) for r in raw), default=float('nan')):.2f}\n")
    text += drift_lines(raw) + "\n"
    text += ("## Per shape class (geomean vs cuBLAS)\n\n| class | n | best/cuBLAS | min | "
             "pick/cuBLAS (model) | pick/cuBLAS (dispatch) | pick/cuBLAS (autotune) |\n"
             "|---|---|---|---|---|---|---|\n")

    def mode_gmean(rs, mode):
        got = [r[mode]["vs_cublas"] for r in rs if mode in r]
        return gmean(got) if got else float("nan")

    for cls in ("decode", "narrow_n", "short_k", "large", "other"):
        rs = [r for r in raw if r["class"] == cls]
        if not rs:
            continue
        text += (f"| {cls} | {len(rs)} | {gmean([best_vs(r) for r in rs]):.3f} | "
                 f"{min(best_vs(r) for r in rs):.2f} | "
                 f"{mode_gmean(rs, 'model'):.3f} | {mode_gmean(rs, 'dispatch'):.3f} | "
                 f"{mode_gmean(rs, 'autotune'):.3f} |\n")
    for mode in ("dispatch", "autotune"):
        if not any(mode in r for r in raw):
            continue
        worst = sorted((r for r in raw if mode in r), key=lambda r: -r[mode]["regret"])[:10]
        text += (f"\n## Worst 10 by regret ({mode} mode)\n\n| dtype | shape | pick | source | regret "
                 "| best |\n|---|---|---|---|---|---|\n")
        for r in worst:
            text += (f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r[mode]['pick']} | "
                     f"{r[mode]['source']} | {r[mode]['regret']:.3f} | {r['best']} |\n")
    text += ("\n## Every shape\n\n| dtype | shape | class | cuBLAS µs | best µs | best | best/cuBLAS "
             "| model pick | regret | dispatch pick | regret | autotune pick | regret |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    path = write(f"selection_{args.sample}.md", text, args.out)
    print(text[: text.index("## Every shape")])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
