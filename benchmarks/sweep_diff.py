"""Compare the same options across two sweeps of the same shapes (CPU only).

A kernel change that should leave some variants alone and change others
(the split-K ABI v3 added stream-K to the split-K variants only) can be
checked on sweeps already recorded: for each shape in both ``--before`` and
``--after`` (bench_selection.py ``--raw`` files), the options whose label
matches ``--changed`` are compared with themselves, after dividing out the
machine's drift between the runs, taken as the median after/before ratio of
that shape's options whose code the change did not touch (``--touched``:
labels the change did touch, never used for the drift, so a control run
over untouched variants, ``--changed /pp``, divides by untouched code too). It prints the drift-normalised after/before ratio of the changed
options overall, per shape (min, median, max) and by the option's time
before, where a fixed cost shows as a ratio that shrinks with the time.
"""

from __future__ import annotations

import argparse
import statistics

from _common import gmean, load_raw

BANDS = ((0, 10), (10, 20), (20, 50), (50, 200), (200, float("inf")))


def compare(before: list[dict], after: list[dict], changed: str,
            touched: tuple[str, ...] = ("splitk", "streamk")) -> dict:
    old = {(r["dtype"], r["m"], r["n"], r["k"]): r for r in before}
    ratios, deltas, per_shape = [], [], []
    for rec in after:
        prev = old.get((rec["dtype"], rec["m"], rec["n"], rec["k"]))
        if prev is None:
            continue
        t0 = {o[0]: o[3] for o in prev["options"]}
        t1 = {o[0]: o[3] for o in rec["options"]}
        both = [lab for lab in t0 if lab in t1]
        same = [lab for lab in both
                if changed not in lab and not any(t in lab for t in touched)]
        moved = [lab for lab in both if changed in lab]
        if not same or not moved:
            continue
        drift = statistics.median(t1[lab] / t0[lab] for lab in same)
        shape = []
        for lab in moved:
            r = t1[lab] / t0[lab] / drift
            ratios.append((t0[lab], r))
            deltas.append(t1[lab] - t0[lab] * drift)
            shape.append(r)
        per_shape.append((statistics.median(shape), f"{rec['dtype']} {rec['m']}x{rec['n']}x{rec['k']}"))
    per_shape.sort()
    return {"shapes": len(per_shape), "options": len(ratios),
            "median": statistics.median(r for _, r in ratios), "geomean": gmean([r for _, r in ratios]),
            "delta_us": statistics.median(deltas), "per_shape": per_shape,
            "bands": [(lo, hi, [r for t, r in ratios if lo <= t < hi]) for lo, hi in BANDS]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", nargs="+", required=True, help="raws measured before the change")
    ap.add_argument("--after", nargs="+", required=True, help="raws measured after it")
    ap.add_argument("--changed", default="splitk", help="label text of the options compared")
    ap.add_argument("--touched", default="splitk,streamk",
                    help="label texts of every option whose code changed (left out of the drift)")
    args = ap.parse_args()
    out = compare([r for p in args.before for r in load_raw(p)],
                  [r for p in args.after for r in load_raw(p)], args.changed,
                  tuple(t for t in args.touched.split(",") if t))
    if not out["options"]:
        raise SystemExit("no shape has both changed and untouched options in both sweeps")
    ps = out["per_shape"]
    print(f"{out['shapes']} shapes, {out['options']} '{args.changed}' options in both sweeps; "
          f"after / before, drift-normalised: median {out['median']:.3f}, geomean "
          f"{out['geomean']:.3f}; median change {out['delta_us']:+.2f} µs")
    print(f"per shape (median of its options): min {ps[0][0]:.3f} ({ps[0][1]}), median "
          f"{ps[len(ps) // 2][0]:.3f}, max {ps[-1][0]:.3f} ({ps[-1][1]})")
    print("\n| option time before (µs) | options | median after / before |\n|---|---|---|")
    for lo, hi, xs in out["bands"]:
        if xs:
            print(f"| {lo:g}-{hi:g} | {len(xs)} | {statistics.median(xs):.3f} |")


if __name__ == "__main__":
    main()
