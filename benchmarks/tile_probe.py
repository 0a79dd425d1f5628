"""New tiles against the best option an earlier sweep found, on seeded random shapes (GPU).

A full sweep (bench_selection.py) times every option of every shape: about 8 s
a shape on the H200 with today's cache, too slow to try a new tile class on
hundreds of shapes inside one device call. This probe times only what the
question needs, in one process, on fresh operands (nn.Linear layout, cold L2,
CUDA graph replay; tune.timing's rules):

* every option of the candidates whose tile is in ``--tiles`` (a split-K
  candidate's ``--splits`` best split counts by the model's estimate, stream-K
  included when the model offers it);
* the best option an earlier sweep of the same shape recorded (``--from-raw``:
  bench_selection.py raws; the label names the schedule and split count, which
  outlive a rebuild's keys), re-timed here;
* the dispatcher's model pick, and cuBLAS (torch.mm).

Then the old best, the fastest new option, the model pick and cuBLAS are
re-timed interleaved (3 rounds), and the report gives, per shape and over
the sample: old best / cuBLAS, the best of both / cuBLAS, and the new tiles'
gain over the old best (old best µs / best new µs, both from the interleaved
rounds). ``--raw`` writes bench_selection.py's record format (every timed
option with its estimate), so fit_model.py can fit the new tiles' constants
on a fit-sample probe and replay_selection-style scripts can score a model on
a held-out one.

Samples are bench_selection.py's (``--sample fit``: seed 1001, what the model
is fitted on; ``heldout``: seed 2002, never fitted on), narrowed with
``--min-m`` / ``--max-m`` like there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _common import gmean, header, linear_candidates, recorded_best, tiles_arg, write


def probe_options(ranked, tiles: set[tuple[int, int]], splits_per: int,
                  clusters: set[tuple[int, int]] | None = None) -> list:
    """The options of ``ranked`` (the model's (estimate, choice) order) whose
    tile is in ``tiles`` (and cluster in ``clusters``, when given): every plain
    one, and each split-K candidate's ``splits_per`` best split counts by
    estimate."""
    out, per = [], {}
    for _, ch in ranked:
        c = ch.candidate
        if (c.tile_m, c.tile_n) not in tiles:
            continue
        if clusters is not None and (c.cluster_m, c.cluster_n) not in clusters:
            continue
        if c.split_k:
            per[c] = per.get(c, 0) + 1
            if per[c] > splits_per:
                continue
        out.append(ch)
    return out


def summary(raw: list[dict]) -> str:
    """The sample's figures (module docstring), as markdown bullets."""
    if not raw:
        return "- no shape measured\n"
    gains = sorted(r["old_best_us"] / r["new_best_us"] for r in raw)
    text = (f"- shapes: {len(raw)}\n"
            f"- old best / cuBLAS: geomean {gmean([r['cublas_us'] / r['old_best_us'] for r in raw]):.3f}, "
            f"min {min(r['cublas_us'] / r['old_best_us'] for r in raw):.2f}\n"
            f"- best of both / cuBLAS: geomean "
            f"{gmean([r['cublas_us'] / min(r['old_best_us'], r['new_best_us']) for r in raw]):.3f}, "
            f"min {min(r['cublas_us'] / min(r['old_best_us'], r['new_best_us']) for r in raw):.2f}\n"
            f"- time of the best new option / the old best's: geomean {gmean([1 / g for g in gains]):.3f}; "
            f"new faster by > 2% on {sum(g > 1.02 for g in gains)}, slower by > 2% on "
            f"{sum(g < 1 / 1.02 for g in gains)}; median gain {statistics.median(gains):.3f}, "
            f"max {gains[-1]:.3f}\n"
            f"- model pick / cuBLAS: geomean {gmean([r['cublas_us'] / r['model_us'] for r in raw]):.3f}\n")
    by_cls: dict[str, list] = {}
    for r in raw:
        by_cls.setdefault(r["class"], []).append(r)
    text += "\n| class | n | old best / cuBLAS | best of both / cuBLAS | new wins > 2% |\n|---|---|---|---|---|\n"
    for cls, rs in sorted(by_cls.items()):
        text += (f"| {cls} | {len(rs)} | {gmean([r['cublas_us'] / r['old_best_us'] for r in rs]):.3f} | "
                 f"{gmean([r['cublas_us'] / min(r['old_best_us'], r['new_best_us']) for r in rs]):.3f} | "
                 f"{sum(r['old_best_us'] / r['new_best_us'] > 1.02 for r in rs)} |\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", required=True, type=tiles_arg, help="MxN[,MxN...]: the new tiles")
    ap.add_argument("--clusters", type=tiles_arg, default=None,
                    help="MxN[,MxN...]: only the new tiles' options in these clusters")
    ap.add_argument("--sample", choices=["fit", "heldout"], default="heldout")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--min-m", type=int, default=None)
    ap.add_argument("--max-m", type=int, default=None)
    ap.add_argument("--start", type=int, default=0, help="skip the (narrowed) sample's first N shapes")
    ap.add_argument("--from-raw", nargs="*", default=[],
                    help="bench_selection.py raws whose recorded best options are re-timed")
    ap.add_argument("--splits", type=int, default=3,
                    help="split counts timed per new split-K candidate (best by estimate)")
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--raw", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.splits < 1:
        ap.error("--splits must be at least 1")
    old = recorded_best(args.from_raw)

    import torch  # noqa: PLC0415 - GPU part only: --help and bad arguments need no CUDA
    from bench_selection import SEEDS, sample, shape_class  # noqa: PLC0415 - imports torch

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune import timing  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    started = time.monotonic()
    raw, lines = [], []
    for dname in args.dtypes.split(","):
        sms, cands = linear_candidates(cache, dname)
        if not any((c.tile_m, c.tile_n) in args.tiles for c in cands):
            print(f"the cache has no {dname} candidate with a tile of {sorted(args.tiles)}",
                  file=sys.stderr)
            sys.exit(2)
        shapes = sample(SEEDS[args.sample], args.count, 20000.0)
        if args.min_m is not None:
            shapes = [s for s in shapes if s[0] >= args.min_m]
        if args.max_m is not None:
            shapes = [s for s in shapes if s[0] <= args.max_m]
        for idx, (m, n, k) in enumerate(shapes[args.start:]):
            if args.budget_s and time.monotonic() - started > args.budget_s:
                print(f"budget reached after {idx} shapes of {dname} (continue with --start "
                      f"{args.start + idx})", file=sys.stderr)
                break
            ranked = select.ranked_choices(cands, m, n, k, 1, sms)
            est = {ch: e for e, ch in ranked}
            by_label = {ch.label(): ch for _, ch in ranked}
            new = probe_options(ranked, args.tiles, args.splits, args.clusters)
            if not new:
                continue
            model = ranked[0][1]
            old_label = old.get((dname, m, n, k))
            old_best = by_label.get(old_label) if old_label else None
            options = list(dict.fromkeys(new + [model] + ([old_best] if old_best else [])))
            sets = timing.cold_operands((dname, dname, dname, "k", "k", "n", 2), m, n, k, 1)
            fns = {o: timing.rotate(launch_choice(cache, o, sms, m, n, 1, k=k), sets) for o in options}
            times = {o: timing.time_us(fns[o], reps=3, rep_us=150, graph=True) for o in options}
            best_new = min(new, key=times.get)
            # Without a recorded best, the old options timed here stand in
            # (the model pick): the gain is then over the pick.
            base = old_best or model
            again_opts = list(dict.fromkeys([base, best_new, model]))
            ref = timing.rotate(lambda a, b, out: torch.mm(a, b, out=out), sets)
            again = timing.interleaved([ref] + [fns[o] for o in again_opts], graph=True)
            t = dict(zip(again_opts, again[1:]))
            best = min(times, key=times.get)
            rec = {"dtype": dname, "m": m, "n": n, "k": k, "cublas_us": again[0],
                   "best": best.label(), "best_us": times[best],
                   "options": [[o.label(), o.candidate.key, o.splits, times[o], est[o]] for o in options],
                   "class": shape_class(m, n, k), "l2": timing.L2_POLICY,
                   "old_best": base.label(), "old_best_recorded": old_best is not None,
                   "old_best_us": t[base], "new_best": best_new.label(), "new_best_us": t[best_new],
                   "model": {"pick": model.label(), "source": "model", "us": t[model]},
                   "model_us": t[model]}
            raw.append(rec)
            if args.raw:
                Path(args.raw).write_text(json.dumps(raw))
            line = (f"| {dname} | {m}x{n}x{k} | {rec['class']} | {again[0]:.1f} | {base.label()} | "
                    f"{t[base]:.1f} | {best_new.label()} | {t[best_new]:.1f} | "
                    f"{t[base] / t[best_new]:.3f} | {again[0] / min(t[base], t[best_new]):.3f} |")
            lines.append(line)
            print(line, flush=True)
            fns = sets = None
            torch.cuda.empty_cache()
    narrowed = "".join([f", M >= {args.min_m}" if args.min_m is not None else "",
                        f", M <= {args.max_m}" if args.max_m is not None else "",
                        f", from shape {args.start}" if args.start else ""])
    text = header(f"New tiles {sorted(args.tiles)} against the recorded best ({args.sample} sample)")
    text += (f"Sample: {args.sample} (seed {SEEDS[args.sample]}){narrowed}, dtypes {args.dtypes}; "
             f"nn.Linear layout, cold L2, CUDA graph replay. Old best: the fastest option "
             f"{', '.join(args.from_raw) or '(no raws given: the model pick)'} recorded for the shape, "
             "re-timed here; it, the fastest new option, the model pick and cuBLAS re-timed "
             f"interleaved, 3 rounds. Wall time {time.monotonic() - started:.0f} s.\n\n## Summary\n\n")
    text += summary(raw)
    text += ("\n## Every shape\n\n| dtype | shape | class | cuBLAS µs | old best | µs | best new | µs "
             "| old / new | cuBLAS / best of both |\n|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw))
    path = write("tile_probe.md", text, args.out)
    print(text[: text.index("## Every shape")])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
