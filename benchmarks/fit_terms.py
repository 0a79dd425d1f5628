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

    def named(flag: str, spec: str, names=tuple(select.MODEL)) -> tuple[str, list[float]]:
        name, _, values = spec.partition("=")
        try:
            if name in names and values:
                return name, [float(v) for v in values.split(",")]
        except ValueError:
            pass
        ap.error(f"{flag} {spec!r}: want NAME=V1,V2,... with numbers and NAME one of {sorted(names)}")

    axes = dict(named("--grid", spec) for spec in args.grid)
    names = list(axes)
    shipped = {n: select.MODEL[n] for n in names}
    # A baseline names searched constants only: one outside the grid would
    # stay set while the chosen values are replayed.
    base = dict(shipped)
    for spec in args.baseline:
        name, values = named("--baseline", spec, names)
        if len(values) != 1:
            ap.error(f"--baseline {spec!r}: want one value")
        base[name] = values[0]
    fit = [x for p in args.fit for x in load(p)]
    reports = [(p, load(p)) for p in args.report]
    base_obj, base_reg = evaluate(fit)
    print(f"fit set: {len(fit)} problems; shipped ({shipped}): objective {base_obj:.4f}, "
          f"regret {summary(base_reg)}")
    grid = []
    for values in itertools.product(*axes.values()):
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
