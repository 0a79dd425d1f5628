"""Fit the selection model's constants to measured option timings (CPU only).

Input: the ``--raw`` JSON of ``bench_selection.py --sample fit`` (every
(variant, split) option of every shape, timed on the GPU). Output: the
constants for run/select.py (MODEL, TILE_EFFICIENCY), printed as Python,
and the fit-sample regret before and after. The held-out sample is never read here: it is what the fitted model
is then reported on (bench_selection.py --sample heldout).

Method: coordinate descent on multiplicative steps, minimizing the mean
log-regret of the model's argmin over each shape's options plus a small
weight on the squared log error of its time predictions (which keeps the
constants physical where the argmin does not constrain them).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics

from _common import load_raw

from cutlass_aot.run import select


def parse_label(label: str, key: str) -> tuple[select.Candidate, int]:
    if label.startswith("gemv"):  # the gemv family: tokens x weight rows
        t, r = (int(x) for x in label[4:].split("x"))
        return select.Candidate(key, t, r, 1, 1, gemv=True), 1
    parts = label.split("/")
    tm, tn = (int(x) for x in parts[0].split("x"))
    cm, cn = (int(x) for x in parts[1].split("x"))
    raster, swizzle = parts[2][0], int(parts[2][1:])
    swap = "swap" in parts
    pingpong = "pp" in parts
    splits = 1
    split = False
    k_cluster = 1
    promote = 0
    for p in parts:
        if p.startswith("splitk"):
            split = True
            splits = int(p[7:]) if len(p) > 6 else 1
        elif p == "streamk":  # a split-K variant's split count 0
            split, splits = True, 0
        elif p.startswith("kc"):
            k_cluster = int(p[2:])
        elif p.startswith("pr"):
            promote = int(p[2:])
    return (select.Candidate(key, tm, tn, cm, cn, raster, swizzle, swap, split,
                             pingpong=pingpong, k_cluster=k_cluster, promote=promote), splits)


def load(path: str) -> list[dict]:
    """A fit raw's shapes: bench_selection.py's (and tile_probe.py's)
    records, or bench_decode.py's (``load_decode``), told apart by their
    fields."""
    recs = load_raw(path)
    return decode_shapes(recs) if recs and "pick_us" in recs[0] else parse(recs)


def load_decode(path: str) -> list[dict]:
    """bench_decode.py's ``--raw`` records as ``load``'s shapes (labels carry
    the split count; every option of the problem, cuBLAS left out)."""
    return decode_shapes(load_raw(path))


def decode_shapes(recs: list[dict]) -> list[dict]:
    """``load_decode`` on records already read."""
    shapes = []
    for rec in recs:
        opts = []
        for label, us in sorted(rec["options"]):
            cand, splits = parse_label(label, label)
            opts.append((cand, splits, us))
        shapes.append({"m": rec["m"], "n": rec["n"], "k": rec["k"], "opts": opts,
                       "best": min(o[2] for o in opts)})
    return shapes


def parse(recs: list[dict]) -> list[dict]:
    """Each record's options as (candidate, splits, µs), and its best time."""
    shapes = []
    for rec in recs:
        opts = []
        # Ties go to the first option: sort as the dispatcher's candidates are.
        for label, key, splits, us, _ in sorted(rec["options"], key=lambda o: (o[0], o[2])):
            cand, _ = parse_label(label, key)
            opts.append((cand, splits, us))
        shapes.append({"m": rec["m"], "n": rec["n"], "k": rec["k"], "opts": opts,
                       "best": min(o[2] for o in opts)})
    return shapes


def evaluate(shapes, sms=132, w_err=0.05):
    regrets, err = [], 0.0
    for s in shapes:
        m, n, k = s["m"], s["n"], s["k"]
        keyed = []
        for cand, splits, us in s["opts"]:
            key = select.order_key(cand, splits, m, n, k, 1, sms)
            err += math.log(key[-1][0] / us) ** 2
            keyed.append((key, us))
        # select.model_pick's choice, from the keys computed once here.
        pick = min(keyed, key=lambda o: o[0])
        regrets.append(pick[1] / s["best"])
    return objective(regrets, err, sum(len(s["opts"]) for s in shapes), w_err), regrets


def prepared(shapes, moved, sms=132):
    """Per shape: the rank keys of the options a grid search leaves unchanged,
    computed once, and the options whose terms it searches (``moved(cand,
    splits)`` true) apart, for ``evaluate_moved``."""
    out = []
    for s in shapes:
        m, n, k = s["m"], s["n"], s["k"]
        fixed, searched = [], []
        for cand, splits, us in s["opts"]:
            if moved(cand, splits):
                searched.append((cand, splits, us))
            else:
                fixed.append((select.order_key(cand, splits, m, n, k, 1, sms), us))
        out.append((s, fixed, searched))
    return out


def evaluate_moved(prep, allow: bool, sms=132, w_err=0.05):
    """``evaluate`` over ``prepared`` shapes: only the searched options are
    re-estimated (and their error counted); with ``allow`` false the model
    may not pick them, which gives the baseline without that schedule."""
    regrets, err, n_opts = [], 0.0, 0
    for s, fixed, searched in prep:
        m, n, k = s["m"], s["n"], s["k"]
        keyed = list(fixed)
        for cand, splits, us in searched:
            key = select.order_key(cand, splits, m, n, k, 1, sms)
            err += math.log(key[-1][0] / us) ** 2
            n_opts += 1
            if allow:
                keyed.append((key, us))
        pick = min(keyed, key=lambda o: o[0])
        regrets.append(pick[1] / s["best"])
    return objective(regrets, err, max(n_opts, 1), w_err), regrets


def print_grid(names, grid, top=8):
    """Print a grid search's best ``top`` rows, ``grid`` being (objective,
    values, fit regrets) sorted best first, and the chosen values."""
    print("\n| " + " | ".join(names) + " | objective | fit regret |\n|" + "---|" * (len(names) + 2))
    for obj, values, reg in grid[:top]:
        print("| " + " | ".join(map(str, values)) + f" | {obj:.4f} | {summary(reg)} |")
    print("\nchosen: " + ", ".join(f"{n} {v}" for n, v in zip(names, grid[0][1])))


def objective(regrets, err, n_opts, w_err=0.05):
    """The fit's objective (module docstring): mean log regret of the picks,
    a share of the worst, and the mean squared log error over ``n_opts``
    estimated options."""
    logs = [math.log(r) for r in regrets]
    return sum(logs) / len(logs) + 0.5 * max(logs) / 10 + w_err * err / n_opts


def summary(regrets):
    r = sorted(regrets)
    return f"median {statistics.median(r):.3f} p90 {r[int(0.9 * (len(r) - 1))]:.3f} worst {r[-1]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+", help="fit-sample raws (several: fitted on their union)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--subsample", type=int, default=0)
    ap.add_argument("--max-efficiency", type=float, default=1.0,
                    help="cap on a tile's fitted fraction of the tensor-core peak (physical: <= 1)")
    ap.add_argument("--only-pingpong", action="store_true",
                    help="fit only the pingpong constants (select.PINGPONG)")
    ap.add_argument("--only-model", action="store_true",
                    help="fit only select.MODEL's bandwidths and fixed costs; keep every tile's "
                         "efficiency (for a re-timing that changes memory traffic, not the mainloop)")
    ap.add_argument("--decode", action="append", default=[],
                    help="also fit on a bench_decode.py --raw (the decode grid becomes a suite "
                         "fitted on; report on the held-out sample)")
    ap.add_argument("--only-tiles", default="",
                    help="fit only these tiles' efficiencies, e.g. 256x144,256x160 (new tiles, "
                         "every other constant held)")
    args = ap.parse_args()
    shapes = [s for path in args.raw for s in load(path)]
    shapes += [s for path in args.decode for s in load_decode(path)]
    if args.subsample:
        shapes = random.Random(0).sample(shapes, args.subsample)
    obj, reg = evaluate(shapes)
    print(f"before: objective {obj:.4f}, regret {summary(reg)}", flush=True)
    # (the dict holding a constant, its key, whether it is an efficiency)
    pingpong = [(select.PINGPONG["efficiency"], t, True) for t in select.PINGPONG["efficiency"]] + \
        [(select.PINGPONG, "unit_share", False)]
    model = [(select.MODEL, k, False) for k in select.MODEL if k != "peak_tflops"]
    only = [tuple(int(x) for x in t.split("x")) for t in args.only_tiles.split(",") if t]
    for t in only:
        select.TILE_EFFICIENCY.setdefault(t, 0.5)
    knobs = [(select.TILE_EFFICIENCY, t, True) for t in only] if only else \
        pingpong if args.only_pingpong else model if args.only_model else (
        model + [(select.TILE_EFFICIENCY, t, True) for t in select.TILE_EFFICIENCY] + pingpong)
    steps = [0.6, 0.8, 0.9, 1.1, 1.25, 1.6]
    for rnd in range(args.rounds):
        improved = False
        for d, name, efficiency in knobs:
            base = d[name]
            best_v, best_obj = base, obj
            for f in steps:
                d[name] = min(base * f, args.max_efficiency) if efficiency else base * f
                o, _ = evaluate(shapes)
                if o < best_obj - 1e-5:
                    best_v, best_obj = d[name], o
            d[name] = best_v
            if best_obj < obj:
                obj, improved = best_obj, True
        _, reg = evaluate(shapes)
        print(f"round {rnd}: objective {obj:.4f}, regret {summary(reg)}", flush=True)
        if not improved:
            break
    print("MODEL =", json.dumps({k: round(v, 4) for k, v in select.MODEL.items()}))
    print("TILE_EFFICIENCY =", {k: round(v, 4) for k, v in select.TILE_EFFICIENCY.items()})
    print("PINGPONG =", {"efficiency": {k: round(v, 4) for k, v in select.PINGPONG["efficiency"].items()},
                         "unit_share": round(select.PINGPONG["unit_share"], 4)})


if __name__ == "__main__":
    main()
