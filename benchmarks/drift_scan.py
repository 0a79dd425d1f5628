"""Timing drift across recorded selection sweeps (CPU only).

_common.timing_drift over every bench_selection.py / option-sweep raw given
(default: every ``results/raw/*selection*_raw.json.xz``): per file, the
records whose best option re-timed outside 1/tol..tol of its own sweep
time, and over all files how the drift splits by the problem's size. A
heavy problem re-timed slower than its sweep, round after round, says the
sweep's short bursts ran at clocks the sustained re-timing does not hold;
a tiny one moving either way is launch-scale noise.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from pathlib import Path

from _common import RESULTS, header, load_raw, timing_drift, write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="*", help="raws to scan (default: every selection raw in results/raw)")
    ap.add_argument("--tolerance", type=float, default=1.15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.tolerance <= 1:
        ap.error("--tolerance must be above 1")
    paths = args.raw or sorted(glob.glob(str(RESULTS / "raw" / "*selection*_raw.json.xz")))
    text = header("Timing drift across recorded sweeps (best option re-timed / its sweep time)")
    text += ("| file | records | median drift | outside | heavy (>= 0.5 TFLOP) outside, slower | "
             "light (< 1 GFLOP) outside |\n|---|---|---|---|---|---|\n")
    total, heavy, heavy_slow, flagged = 0, 0, 0, []
    for path in paths:
        recs = [r for r in load_raw(path) if "options" in r and "best_us" in r]
        if not recs:
            continue
        median, off = timing_drift(recs, args.tolerance)
        total += len(recs)
        big = [r for r in recs if 2 * r["m"] * r["n"] * r["k"] >= 5e11]
        heavy += len(big)
        slow = [r for r in off if 2 * r["m"] * r["n"] * r["k"] >= 5e11 and r["drift"] > 1]
        heavy_slow += len(slow)
        light = [r for r in off if 2 * r["m"] * r["n"] * r["k"] < 1e9]
        flagged += [(Path(path).name, r) for r in off]
        text += (f"| {Path(path).name} | {len(recs)} | {median:.3f} | {len(off)} | {len(slow)} of "
                 f"{len(big)} | {len(light)} |\n")
    text += (f"\nAll: {len(flagged)} of {total} records outside {1 / args.tolerance:.2f}-"
             f"{args.tolerance:.2f}; heavy problems re-timed slower by more than the tolerance: "
             f"{heavy_slow} of {heavy}.\n")
    slow_drifts = [r["drift"] for _, r in flagged if r["drift"] > 1]
    if slow_drifts:
        text += (f"Slower re-timings: median {statistics.median(slow_drifts):.2f}, "
                 f"largest {max(slow_drifts):.2f}.\n")
    text += ("\n| file | dtype | shape | TFLOP | best | drift |\n|---|---|---|---|---|---|\n")
    for name, r in sorted(flagged, key=lambda x: -x[1]["drift"]):
        if r["drift"] > 1:
            text += (f"| {name} | {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | "
                     f"{2 * r['m'] * r['n'] * r['k'] / 1e12:.2f} | {r['best']} | {r['drift']:.2f} |\n")
    print(text)
    if args.out:
        write("drift_scan", text, args.out)


if __name__ == "__main__":
    main()
