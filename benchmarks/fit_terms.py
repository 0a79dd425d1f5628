"""Grid-search named constants of the selection model on fit raws (CPU only).

``--grid NAME=V1,V2,...`` (repeatable) names constants of
``run/select.MODEL`` and the values to try; every other constant is held.
Each combination is scored by fit_model's objective on the ``--fit`` raws
(bench_selection.py ``--raw`` files of the fit sample: the model picks among
every recorded option), and the best is replayed on the ``--report`` raws
(the held-out sample), which nothing here is fitted on. A general form of
fit_streamk.py, for refitting a term after a kernel change moved it (the
split-K ABI v3's second pass, r17).
"""

from __future__ import annotations

import argparse
import itertools

from _common import gmean
from fit_model import evaluate, load, print_grid, summary

from cutlass_aot.run import select


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", nargs="+", required=True, help="bench_selection raws fitted on")
    ap.add_argument("--report", nargs="*", default=[], help="held-out raws, replayed only")
    ap.add_argument("--grid", action="append", required=True, metavar="NAME=V1,V2,...")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--baseline", action="append", default=[], metavar="NAME=V",
                    help="report the chosen values against these (default: the shipped ones)")
    args = ap.parse_args()
    names, axes = [], []
    for spec in args.grid:
        name, _, values = spec.partition("=")
        if name not in select.MODEL or not values:
            ap.error(f"--grid {spec!r}: want NAME=V1,V2,... with NAME one of {sorted(select.MODEL)}")
        names.append(name)
        axes.append([float(v) for v in values.split(",")])
    shipped = {n: select.MODEL[n] for n in names}
    base = dict(shipped)
    for spec in args.baseline:
        name, _, value = spec.partition("=")
        if name not in select.MODEL or not value:
            ap.error(f"--baseline {spec!r}: want NAME=V with NAME one of {sorted(select.MODEL)}")
        base[name] = float(value)
    fit = [x for p in args.fit for x in load(p)]
    reports = [(p, load(p)) for p in args.report]
    base_obj, base_reg = evaluate(fit)
    print(f"fit set: {len(fit)} problems; shipped ({shipped}): objective {base_obj:.4f}, "
          f"regret {summary(base_reg)}")
    grid = []
    for values in itertools.product(*axes):
        select.MODEL.update(zip(names, values))
        obj, reg = evaluate(fit)
        grid.append((obj, values, reg))
    grid.sort(key=lambda g: g[0])
    print_grid(names, grid, args.top)
    chosen = dict(zip(names, grid[0][1]))
    label = "shipped" if base == shipped else f"baseline {base}"
    every_before, every_after = [], []
    for path, shapes in reports:
        select.MODEL.update(base)
        _, before = evaluate(shapes)
        select.MODEL.update(chosen)
        _, after = evaluate(shapes)
        every_before += before
        every_after += after
        print(f"report {path} (n={len(shapes)}): {label} {summary(before)}; chosen {summary(after)}")
    if len(reports) > 1:
        print(f"report, all {len(every_before)}: {label} {summary(every_before)}, geomean "
              f"{gmean(every_before):.4f}; chosen {summary(every_after)}, geomean {gmean(every_after):.4f}")
    select.MODEL.update(shipped)


if __name__ == "__main__":
    main()
