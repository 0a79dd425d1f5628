"""One report for a bench_selection sample measured in parts (CPU only).

A device call's time limit cuts bench_selection.py's held-out (or table)
run into parts (``--start``), and a model change between parts leaves some pairs
measured with an older pick. This script merges the parts' ``--raw`` files
(a later file's record replaces an earlier one of the same dtype and shape)
and, where option_retime.py re-timed a pair under the final model (a later
report's re-timings of a pair replace an earlier report's), takes
that pick's regret from the re-timing (its "vs best" column, the pick being
the option of rank 1; the median where the shape was re-timed several
times) and its ratio to cuBLAS as the part's cuBLAS / best
over that regret. It prints the summary bench_selection.py prints for one
run: regret median, p90 and worst, pick and best vs cuBLAS, per class, the
10 worst, and says how many pairs each source gave.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict

from _common import best_vs, drift_lines, gmean, header, load_raw, write

MODES = ("dispatch", "model", "autotune")  # bench_selection.py's pick records


def retimed(path: str, dtype: str, into: dict) -> None:
    """Add (dtype, m, n, k) -> [(pick label, regret), ...] from an
    option_retime.py report (a shape listed twice there gives two entries)."""
    shape = None
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            m = re.match(r"## (\d+)x(\d+)x(\d+)", line)
            shape = tuple(int(x) for x in m.groups()) if m else None
        elif shape and line.startswith("| ") and not line.startswith("| option"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[-1] == "1":
                into.setdefault((dtype, *shape), []).append((cells[0], float(cells[4])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="+", help="bench_selection.py --raw files, in the order measured")
    ap.add_argument("--retime", action="append", default=[], metavar="DTYPE:REPORT",
                    help="an option_retime.py report of the final model's picks, e.g. bf16:retime.md")
    ap.add_argument("--mode", default="dispatch", choices=MODES,
                    help="whose pick is scored: the dispatcher's (table, then model; the "
                         "default), the model's alone, or autotune's. A part measured on a GPU "
                         "the shipped table does not name (an H100) has no dispatch records")
    ap.add_argument("--title", default="Held-out sample, merged from its parts")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    recs = {}
    for path in args.raw:
        for r in load_raw(path):
            recs[(r["dtype"], r["m"], r["n"], r["k"])] = r
    again: dict[tuple, list] = {}
    for spec in args.retime:
        # A later report's re-timings of a pair replace an earlier one's
        # (its pick may be another model's), as a later raw's record does.
        dtype, path = spec.split(":", 1)
        report: dict[tuple, list] = {}
        retimed(path, dtype, report)
        again.update(report)
    rows = []
    for key, r in recs.items():
        # the live regret divides by the fastest re-timed option (_common.best_vs)
        best_ratio = best_vs(r)
        if key in again:
            pick = again[key][0][0]
            regret = statistics.median(r for _, r in again[key])
            source = f"re-timed x{len(again[key])}"
        else:
            if args.mode not in r:
                have = ", ".join(m for m in MODES if m in r)
                raise SystemExit(f"heldout_merge: {r['dtype']} {r['m']}x{r['n']}x{r['k']} has no "
                                 f"{args.mode} record (it has: {have or 'none'}); pass --mode "
                                 "with one of those")
            pick, regret = r[args.mode]["pick"], r[args.mode]["regret"]
            source = "live"
        rows.append({"key": key, "class": r["class"], "pick": pick, "regret": regret,
                     "best": r["best"], "best_vs": best_ratio, "pick_vs": best_ratio / regret,
                     "source": source})
    text = header(args.title)
    text += (f"Picks scored: {args.mode} mode. Parts: {', '.join(args.raw)}; re-timed picks: {', '.join(args.retime) or 'none'}. "
             "regret = time(pick) / time(best option of the sweep), measured live (best and pick "
             "re-timed interleaved in the part's run), or from the re-timing for a pair whose "
             "pick the final model changed or whose live figure was re-checked.\n\n")
    for dtype in sorted({r["key"][0] for r in rows}) + ["all"]:
        sel = [r for r in rows if dtype in ("all", r["key"][0])]
        reg = sorted(r["regret"] for r in sel)
        text += (f"- {dtype}: n={len(sel)} ({sum(r['source'] != 'live' for r in sel)} re-timed); "
                 f"regret median {statistics.median(reg):.3f}, p90 {reg[int(0.9 * (len(reg) - 1))]:.3f}, "
                 f"worst {reg[-1]:.3f}; pick / cuBLAS {gmean([r['pick_vs'] for r in sel]):.3f}; "
                 f"best cached / cuBLAS {gmean([r['best_vs'] for r in sel]):.3f} "
                 f"(min {min(r['best_vs'] for r in sel):.2f})\n")
    text += drift_lines(list(recs.values()))
    text += "\n| class | n | best/cuBLAS | pick/cuBLAS |\n|---|---|---|---|\n"
    by = defaultdict(list)
    for r in rows:
        by[r["class"]].append(r)
    for c, sel in sorted(by.items()):
        text += (f"| {c} | {len(sel)} | {gmean([r['best_vs'] for r in sel]):.3f} | "
                 f"{gmean([r['pick_vs'] for r in sel]):.3f} |\n")
    text += "\n| dtype | shape | pick | regret | best | source |\n|---|---|---|---|---|---|\n"
    for r in sorted(rows, key=lambda r: -r["regret"])[:10]:
        d, m, n, k = r["key"]
        text += f"| {d} | {m}x{n}x{k} | {r['pick']} | {r['regret']:.3f} | {r['best']} | {r['source']} |\n"
    print(text)
    if args.out:
        write("heldout_merge", text, args.out)


if __name__ == "__main__":
    main()
