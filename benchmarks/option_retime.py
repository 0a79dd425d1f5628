"""Is a recorded regret real? Re-time a shape's options round by round (GPU).

bench_selection.py times each (variant, split) option of a shape once, in
one sweep. When the model's pick is recorded far behind the best option,
the gap can be the pick's fault or the sweep's noise. This script takes
shapes (``--shapes MxNxK,...``), times every listed option of each
(``--options``: labels as the reports print them, or ``all`` for every
option of the shape's candidates; a split-K label names its split count)
interleaved over ``--rounds`` rounds, under CUDA graph
replay with cold L2 (tune.timing's rules), and prints each option's median,
its spread over the rounds, and the model's estimate and rank.

A regret that holds round after round, with a spread smaller than the gap,
is the model's to fix; one that moves with the rounds is noise. A shape
listed twice is timed twice on fresh operands at new addresses: a ratio
that flips between the two depends on where the operands landed.

``--raw FILE`` writes each shape as bench_selection.py's sweep record
(every option's median over the rounds, its best, and cuBLAS's median with
``--cublas``), so ``_common.recorded_best`` and ``pick_ab.py plan
--against-best`` take a re-timed shape's best option from it.

``--cublas`` times torch.mm on the same operands in the same rounds, as a
row of its own: a probe of shapes that differ by a few elements (an
aligned shape and its neighbours) then shows which dimension's remainder
costs the cached kernels more than it costs cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _common import header, linear_candidates, write

from cutlass_aot.run import select


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``MxNxK[,MxNxK...]`` as (M, N, K) tuples of positive ints; ValueError names the bad part."""
    out = []
    for part in text.split(","):
        dims = part.strip().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"{part.strip()!r} is not MxNxK with positive integers")
        out.append(tuple(int(d) for d in dims))
    return out


def shapes_arg(text: str) -> list[tuple[int, int, int]]:
    """``parse_shapes`` as an argparse type: a bad part is a usage error (exit 2)."""
    try:
        return parse_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, type=shapes_arg, help="MxNxK[,MxNxK...]")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--options", default="all",
                    help="comma-separated option labels (as the reports print them), or 'all'")
    ap.add_argument("--top", type=int, default=0,
                    help="with --options all: only the model's first N options and the rest's "
                         "fastest by estimate from each tile (0: every option)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rep-us", type=float, default=300.0)
    ap.add_argument("--cublas", action="store_true",
                    help="also time torch.mm (cuBLAS) on the same operands, interleaved")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--raw", default=None, help="write bench_selection-style records here")
    args = ap.parse_args()
    shapes = args.shapes
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be at least 1")

    import torch  # noqa: PLC0415 - GPU part only: --help runs without CUDA

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    sms, cands = linear_candidates(cache, args.dtype)
    wanted = None if args.options == "all" else {s.strip() for s in args.options.split(",")}
    text = header(f"Options re-timed round by round ({args.dtype})")
    text += (f"Per shape: fresh operands (nn.Linear layout, cold L2), each option timed "
             f"interleaved over {args.rounds} rounds ({args.reps} reps of ~{args.rep_us:.0f} µs, "
             "CUDA graph replay). median / min / max: over the rounds, µs. est: the model's "
             "µs; rank: its place in the model's order (1 = the pick).\n")
    start = time.monotonic()
    records = []
    for m, n, k in shapes:
        # The model's order: rank 1 is the dispatcher's model pick, as
        # heldout_merge.py reads it.
        ranked = select.ranked_choices(cands, m, n, k, 1, sms)
        rank = {ch.label(): i + 1 for i, (_, ch) in enumerate(ranked)}
        est = {ch.label(): e for e, ch in ranked}
        if wanted is not None:
            opts = [ch for _, ch in ranked if ch.label() in wanted]
        elif args.top:
            opts = [ch for _, ch in ranked[:args.top]]
            seen = {(ch.candidate.tile_m, ch.candidate.tile_n) for ch in opts}
            for _, ch in ranked[args.top:]:
                t = (ch.candidate.tile_m, ch.candidate.tile_n)
                if t not in seen:
                    seen.add(t)
                    opts.append(ch)
        else:
            opts = [ch for _, ch in ranked]
        sets = cold_operands((args.dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        fns = [rotate(launch_choice(cache, ch, sms, m, n, 1, k=k), sets) for ch in opts]
        if args.cublas:
            fns.append(rotate(lambda a, b, out: torch.mm(a, b, out=out), sets))
        per = [[] for _ in fns]
        for _ in range(args.rounds):
            ts = interleaved(fns, rounds=1, reps=args.reps, rep_us=args.rep_us, graph=True)
            for i, t in enumerate(ts):
                per[i].append(t)
        ref = per.pop() if args.cublas else None
        rows = sorted(zip(opts, per), key=lambda r: statistics.median(r[1]))
        best = statistics.median(rows[0][1])
        text += f"\n## {m}x{n}x{k}\n\n"
        if ref is not None:
            tf = 2 * m * n * k / statistics.median(ref) / 1e6
            text += (f"cuBLAS (torch.mm): median {statistics.median(ref):.1f} µs ({tf:.0f} TFLOP/s), "
                     f"min {min(ref):.1f}, max {max(ref):.1f}; cuBLAS / best option "
                     f"{statistics.median(ref) / best:.3f}\n\n")
        text += "| option | median µs | min | max | vs best | est µs | rank |\n"
        text += "|---|---|---|---|---|---|---|\n"
        for ch, ts in rows:
            med = statistics.median(ts)
            text += (f"| {ch.label()} | {med:.1f} | {min(ts):.1f} | {max(ts):.1f} | {med / best:.3f} | "
                     f"{est[ch.label()]:.1f} | {rank[ch.label()]} |\n")
        print(text.split(f"## {m}x{n}x{k}")[-1], flush=True)
        records.append({"dtype": args.dtype, "m": m, "n": n, "k": k,
                        "cublas_us": statistics.median(ref) if ref is not None else None,
                        "best": rows[0][0].label(), "best_us": best,
                        "options": [[ch.label(), ch.candidate.key, ch.splits, statistics.median(ts),
                                     est[ch.label()]] for ch, ts in rows]})
        if args.raw:  # after every shape: a run cut short keeps what it measured
            Path(args.raw).write_text(json.dumps(records))
        sets = fns = None
        torch.cuda.empty_cache()
    text += f"\nWall time {time.monotonic() - start:.0f} s.\n"
    write("option_retime", text, args.out)


if __name__ == "__main__":
    main()
