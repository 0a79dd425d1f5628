"""Fit the K-cluster schedule's terms of the selection model (CPU only).

The model (run/select.py, ``_estimate``) times a K-cluster option as waves
of tiles, each CTA running its share of K, plus an exchange of fp32
partials per tile: ``kcluster_us`` fixed, plus ``kcluster_kb_us`` per KiB
the cluster's other CTAs push to the first; a cluster of 3 or 4 CTAs costs
``kcluster_wide`` more per CTA beyond 2; and the clusters of 3 and 4 CTAs
the GPU runs at once (select.CLUSTER_SLOTS_132). Every other constant is
held. This grid-searches those five, with the model allowed to pick K-cluster
options (``--allow``), on recorded sweeps that are not the held-out sample:

* the fit sample's small-M shapes (``bench_selection.py --sample fit
  --max-m 256 --raw``), the only sweep with K-cluster options at short K;
* ``--decode`` raws (bench_decode.py) and ``--table`` raws (the table's own
  problems), both with K >= 4096.

Objective: fit_model.py's (mean log regret of the picks, a share of the
worst, a small weight on the squared log error of the estimates). Then it
replays the result on ``--report`` raws (the held-out sample), which
nothing here was fitted on, next to the model without K-cluster picks.
"""

from __future__ import annotations

import argparse
import itertools

from fit_model import evaluate_moved, load, load_decode, prepared, print_grid, summary

from cutlass_aot.run import select


def moved(cand: select.Candidate, splits: int) -> bool:
    """A K-cluster option: the terms searched here move only these estimates."""
    return cand.k_cluster > 1


def set_values(names, values, slots) -> None:
    """Set the K-cluster constants in select.MODEL and the slot counts."""
    for name, v in zip(names, values):
        if name.startswith("slots"):
            slots[int(name[5:])] = int(v)
        else:
            select.MODEL[name] = v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", nargs="+", required=True, help="bench_selection raws fitted on")
    ap.add_argument("--decode", nargs="*", default=[], help="bench_decode raws fitted on")
    ap.add_argument("--report", nargs="*", default=[], help="held-out raws, replayed only")
    ap.add_argument("--fixed", default="0.25,0.5,1,1.5,2,3,4,6")
    ap.add_argument("--per-kb", default="0,0.005,0.01,0.02,0.04,0.06,0.08,0.12")
    ap.add_argument("--wide", default="0,0.05,0.1,0.15,0.2,0.3")
    ap.add_argument("--slots3", default="44,42,41,40,39,38,37",
                    help="clusters of 3 CTAs run at once on 132 SMs (select.CLUSTER_SLOTS_132)")
    ap.add_argument("--slots4", default="33,32,31,30,29")
    args = ap.parse_args()
    shapes = [x for p in args.fit for x in load(p)] + [x for p in args.decode for x in load_decode(p)]
    prep = prepared(shapes, moved)
    base_obj, base_reg = evaluate_moved(prep, allow=False)
    print(f"fit set: {len(shapes)} problems; without K-cluster picks: objective {base_obj:.4f}, "
          f"regret {summary(base_reg)}")
    grid = []
    names = ("kcluster_us", "kcluster_kb_us", "kcluster_wide", "slots3", "slots4")
    slots = select.CLUSTER_SLOTS_132
    for values in itertools.product(*(map(float, a.split(",")) for a in
                                      (args.fixed, args.per_kb, args.wide, args.slots3,
                                       args.slots4))):
        set_values(names, values, slots)
        obj, reg = evaluate_moved(prep, allow=True)
        grid.append((obj, values, reg))
    grid.sort(key=lambda g: g[0])
    print_grid(names, grid)
    values = grid[0][1]
    set_values(names, values, slots)
    for path in args.report:
        rep = prepared(load(path), moved)
        _, before = evaluate_moved(rep, allow=False)
        _, after = evaluate_moved(rep, allow=True)
        print(f"report {path}: without K-cluster picks {summary(before)}; with {summary(after)}")
        worst = sorted(((r, s["m"], s["n"], s["k"]) for r, (s, _, _) in zip(after, rep)),
                       reverse=True)[:5]
        print("  worst with:", ", ".join(f"{m}x{n}x{k} {r:.3f}" for r, m, n, k in worst))


if __name__ == "__main__":
    main()
