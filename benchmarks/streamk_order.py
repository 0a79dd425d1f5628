"""Stream-K's piece order, old against new, in one process (GPU)

A stream-K slot whose run crosses a tile edge used to take its earlier tile
first, so neighbouring slots stood apart in K and, on long K, read their
shared operand band from HBM once per tile; since r19 it takes the later
tile first and every crossing slot reads the same k-slice at the same step
(kernels/sm90_gemm.py's module docstring). This script times the same
stream-K option from two caches built from the two sources (``--old`` and
the default cache), its plain sibling (same tile, cluster, raster, swizzle
and swap, no split-K) and torch.mm, interleaved over ``--rounds`` under CUDA
graph replay with cold L2 (tune.timing's rules), and checks that the two
orders give the same bits: the reduce pass sums a tile's pieces in slot
order, whatever order a slot ran them in.

Pairs, in this order: ``--sample N`` draws N fresh seeded shapes
(``--seed``) where the fix should matter: a partial last wave of T tiles on
the P slots with P/2 < T < P (so most runs cross an edge), two to four tile
columns sharing each A band, and K of 4096..57344, timed with the drawn
tile's stream-K option. Then ``--from-raw`` takes every shape of
bench_selection raw files that the model picked stream-K for (those first)
or whose fastest stream-K option reached ``--within`` of the shape's best
option, with that option. ``--list`` prints the pairs (no GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import time

from _common import gmean, header, load_raw, write

from cutlass_aot.run import select

H200_SMS = 132


def raw_pairs(paths: list[str], within: float) -> list[tuple[str, int, int, int, str]]:
    """(dtype, m, n, k, stream-K label) from bench_selection raws (module docstring)."""
    out = []
    for path in paths:
        for r in load_raw(path):
            sk = [o for o in r["options"] if "/streamk" in o[0]]
            if not sk:
                continue
            fastest = min(sk, key=lambda o: o[3])
            pick = r.get("dispatch", {}).get("pick", "")
            label = pick if "/streamk" in pick else fastest[0]
            if "/streamk" in pick or fastest[3] <= within * r["best_us"]:
                # the model's stream-K picks first, then the shortest calls
                order = (0 if "/streamk" in pick else 1, fastest[3])
                out.append((order, (r["dtype"], r["m"], r["n"], r["k"], label)))
    seen, pairs = set(), []
    for _, p in sorted(out):
        if p not in seen:
            seen.add(p)
            pairs.append(p)
    return pairs


def sample_shapes(count: int, seed: int, sms: int = H200_SMS) -> list[tuple[str, int, int, int, str]]:
    """Fresh seeded (dtype, m, n, k, stream-K label) with a long K and a
    partial last wave of the drawn tile between half and all of the slots
    (module docstring)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        tm, tn, cm = rng.choice(((256, 160, 1), (128, 256, 2), (128, 256, 1), (256, 128, 1)))
        slots = sms // cm
        cols = rng.randint(2, 4)
        waves = rng.randint(1, 3)
        # clusters = clusters_m x cols, its remainder on the slots in (P/2, P)
        lo, hi = waves * slots + slots // 2 + 1, (waves + 1) * slots - 1
        choices = [c for c in range(-(-lo // cols), hi // cols + 1) if lo <= c * cols <= hi]
        if not choices:
            continue
        clusters_m = rng.choice(choices)
        m = rng.randint((clusters_m * cm - 1) * tm + 1, clusters_m * cm * tm)
        n = 8 * rng.randint(((cols - 1) * tn) // 8 + 1, (cols * tn) // 8)
        k = 8 * round(math.exp(rng.uniform(math.log(4096), math.log(57344))) / 8)
        out.append((rng.choice(("bf16", "f16")), m, n, k, f"{tm}x{tn}/{cm}x1/m1/streamk"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="cache built from the old sources (first-tile-first)")
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"),
                    help="cache built from the new sources (default: CUTLASS_AOT_CACHE_DIR)")
    ap.add_argument("--from-raw", nargs="*", default=[], help="bench_selection --raw files")
    ap.add_argument("--within", type=float, default=1.05)
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--seed", type=int, default=5005)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rep-us", type=float, default=500.0)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--list", action="store_true", help="print the pairs and exit (no GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.within < 1 or args.sample < 0 or min(args.rounds, args.reps) < 1:
        ap.error("--within must be at least 1, --sample at least 0, --rounds and --reps at least 1")
    for path in args.from_raw:
        if not os.path.isfile(path):
            ap.error(f"no raw file {path}")
    # The fresh sample first (nobody chose it), then the held-out pairs.
    pairs = [(d, m, n, k, lab, f"sample seed {args.seed}") for d, m, n, k, lab in
             sample_shapes(args.sample, args.seed)]
    pairs += [(d, m, n, k, lab, "held-out") for d, m, n, k, lab in raw_pairs(args.from_raw, args.within)]
    if not pairs:
        ap.error("no pairs: give --from-raw files or --sample N")
    if args.list:
        for p in pairs:
            print(*p)
        print(f"{len(pairs)} pairs")
        return
    if not args.old or not os.path.isdir(args.old):
        ap.error("--old must name the old sources' cache directory")

    import torch  # noqa: PLC0415 - GPU part only
    from _common import linear_candidates  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    new, old = cutlass_aot.open_cache(args.cache_dir), cutlass_aot.open_cache(args.old)
    cands = {}
    rows, skipped = [], []
    start = time.monotonic()
    for dtype, m, n, k, label, source in pairs:
        if time.monotonic() - start > args.budget_s:
            skipped.append(f"{dtype} {m}x{n}x{k}: budget reached")
            continue
        if dtype not in cands:
            sms, new_c = linear_candidates(new, dtype)
            _, old_c = linear_candidates(old, dtype)
            cands[dtype] = (sms, new_c, {c.label(): c for c in old_c})
        sms, new_c, old_by = cands[dtype]
        ranked = select.ranked_choices(new_c, m, n, k, 1, sms)
        sk = [(i + 1, ch) for i, (_, ch) in enumerate(ranked) if ch.candidate.split_k
              and ch.splits == 0 and (label is None or ch.label() == label)]
        if not sk:
            skipped.append(f"{dtype} {m}x{n}x{k}: no stream-K option {label or ''} in the new cache")
            continue
        rank, ch = sk[0]
        c = ch.candidate
        # its plain sibling: the same schedule without split-K
        sibling = dataclasses.replace(c, split_k=False).schedule
        plain = [p for _, p in ranked if p.candidate.schedule == sibling and p.candidate.extra == c.extra]
        oc = old_by.get(c.label())
        if oc is None:
            skipped.append(f"{dtype} {m}x{n}x{k}: {c.label()} not in the old cache")
            continue
        old_ch = select.Choice(oc, 0, "diag")
        sets = cold_operands((dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        f_old = launch_choice(old, old_ch, sms, m, n, 1, k=k)
        f_new = launch_choice(new, ch, sms, m, n, 1, k=k)
        fns = [rotate(f_old, sets), rotate(f_new, sets)]
        if plain:
            fns.append(rotate(launch_choice(new, plain[0], sms, m, n, 1, k=k), sets))
        fns.append(rotate(lambda a, b, out: torch.mm(a, b, out=out), sets))
        ts = interleaved(fns, rounds=args.rounds, reps=args.reps, rep_us=args.rep_us, graph=True)
        a, b, out = sets[0]
        f_old(a, b, out)
        got_old = out.clone()
        out.fill_(float("nan"))
        f_new(a, b, out)
        torch.cuda.synchronize()
        same = bool(torch.equal(out, got_old))
        ref = torch.mm(a.float(), b.float())
        err = ((out.float() - ref).norm() / ref.norm()).item()
        row = {"dtype": dtype, "shape": f"{m}x{n}x{k}", "option": ch.label(), "source": source,
               "old": ts[0], "new": ts[1], "plain": ts[2] if plain else math.nan,
               "cublas": ts[-1], "same": same, "err": err,
               "plain_label": plain[0].label() if plain else "-", "rank": rank}
        rows.append(row)
        print(f"{dtype} {m}x{n}x{k} {ch.label()}: old {ts[0]:.1f} new {ts[1]:.1f} plain "
              f"{row['plain']:.1f} cuBLAS {ts[-1]:.1f} same bits {same} err {err:.1e}", flush=True)
        sets = fns = None
        torch.cuda.empty_cache()
    text = header("Stream-K's piece order: first tile first (old) against last tile first (new)")
    text += (__doc__.split("\n\n")[1].replace("\n", " ") + "\n\n"
             f"{args.rounds} rounds x {args.reps} reps of ~{args.rep_us:.0f} µs, median µs. old / new "
             "> 1: the new order is faster. Same bits: the new order's D equals the old's, "
             f"bit for bit. Wall time {time.monotonic() - start:.0f} s.\n\n## Summary\n\n")
    for src in sorted({r["source"] for r in rows}):
        rs = [r for r in rows if r["source"] == src]
        gain = [r["old"] / r["new"] for r in rs]
        vs_plain = [r["plain"] / r["new"] for r in rs if not math.isnan(r["plain"])]
        vs_plain_old = [r["plain"] / r["old"] for r in rs if not math.isnan(r["plain"])]
        text += (f"- {src}: {len(rs)} pairs; old / new geomean {gmean(gain):.3f} (min {min(gain):.3f}, "
                 f"max {max(gain):.3f}); plain / stream-K geomean {gmean(vs_plain_old):.3f} old, "
                 f"{gmean(vs_plain):.3f} new (min {min(vs_plain, default=math.nan):.3f}); cuBLAS / "
                 f"new {gmean([r['cublas'] / r['new'] for r in rs]):.3f}; same bits "
                 f"{sum(r['same'] for r in rs)}/{len(rs)}\n")
    text += ("\n| dtype | shape | option | pairs from | old µs | new µs | old / new | plain µs | "
             "plain / new | cuBLAS µs | same bits | rel err | model rank |\n|" + "---|" * 13 + "\n")
    for r in rows:
        text += (f"| {r['dtype']} | {r['shape']} | {r['option']} | {r['source']} | {r['old']:.1f} | "
                 f"{r['new']:.1f} | {r['old'] / r['new']:.3f} | {r['plain']:.1f} | "
                 f"{r['plain'] / r['new']:.3f} | {r['cublas']:.1f} | {'yes' if r['same'] else 'NO'} | "
                 f"{r['err']:.1e} | {r['rank']} |\n")
    if skipped:
        text += "\n## Not timed\n\n" + "\n".join(f"- {s}" for s in skipped) + "\n"
    path = write("streamk_order.md", text, args.out)
    print(text[: text.index("| dtype |")])
    print(f"wrote {path}")
    if not rows or not all(r["same"] and math.isfinite(r["err"]) and r["err"] < 2e-2 for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
