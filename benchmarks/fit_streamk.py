"""Fit the stream-K terms of the selection model (CPU only).

The model (run/select.py, ``_estimate``) times a stream-K option (a split-K
variant at split count 0) as its data-parallel waves plus one balanced wave
in which every worker runs an even share of the tail's k-blocks, with
``streamk_seg`` x ``unit_us`` per tile edge a run crosses and
``streamk_us`` beyond split-K's second pass. Every other constant is held.
This grid-searches those two, with the model allowed to pick stream-K
options, on recorded sweeps that are not the held-out sample (``--fit``:
bench_selection.py --sample fit raws timed with the stream-K options), and
replays the result on ``--report`` raws (the held-out sample), which
nothing here was fitted on, next to the model without stream-K picks.
"""

from __future__ import annotations

import argparse
import itertools

from fit_model import evaluate_moved, load, prepared, print_grid, summary

from cutlass_aot.run import select


def moved(cand: select.Candidate, splits: int) -> bool:
    """A stream-K option (a split-K variant at split count 0): the terms searched
    here move only these estimates."""
    return bool(cand.split_k and splits == 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", nargs="+", required=True, help="bench_selection raws fitted on")
    ap.add_argument("--report", nargs="*", default=[], help="held-out raws, replayed only")
    ap.add_argument("--fixed", default="-2,-1,-0.5,0,0.5,1,2,3,4,6")
    ap.add_argument("--seg", default="0,0.5,1,2,3,5,8")
    args = ap.parse_args()
    shapes = [x for p in args.fit for x in load(p)]
    prep = prepared(shapes, moved)
    base_obj, base_reg = evaluate_moved(prep, allow=False)
    print(f"fit set: {len(shapes)} problems; without stream-K picks: objective "
          f"{base_obj:.4f}, regret {summary(base_reg)}")
    names = ("streamk_us", "streamk_seg")
    grid = []
    for values in itertools.product(*(map(float, a.split(",")) for a in (args.fixed, args.seg))):
        select.MODEL.update(zip(names, values))
        obj, reg = evaluate_moved(prep, allow=True)
        grid.append((obj, values, reg))
    grid.sort(key=lambda g: g[0])
    print_grid(names, grid)
    values = grid[0][1]
    select.MODEL.update(zip(names, values))
    for path in args.report:
        rep = prepared(load(path), moved)
        _, before = evaluate_moved(rep, allow=False)
        _, after = evaluate_moved(rep, allow=True)
        print(f"report {path}: without stream-K {summary(before)}; with {summary(after)}")


if __name__ == "__main__":
    main()
