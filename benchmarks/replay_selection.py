"""Replay the selection model on recorded option timings (CPU only).

Input: the ``--raw`` JSON of ``bench_selection.py`` (every (variant, split)
option of every shape, timed on the GPU, plus cuBLAS re-timed next to the
best option). For each shape, the current model (run/select.py) picks among
the recorded options; the report gives its regret (pick time over the best
option's) and pick / cuBLAS, estimated as cuBLAS / best (measured
interleaved) times best / pick (both from the option sweep).

This is how a model fitted on the fit sample is reported on the held-out
sample without another GPU run; bench_selection.py measures the picks live.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from _common import gmean, load_raw
from fit_model import parse

from cutlass_aot.run import select


def replay(path: str, sms: int = 132) -> dict:
    recs = load_raw(path)
    shapes = parse(recs)
    by_class = defaultdict(list)
    regrets, picks, bests, worst = [], [], [], []
    for rec, s in zip(recs, shapes):
        m, n, k = s["m"], s["n"], s["k"]
        best_opt = s["best"]
        pick = select.model_pick(s["opts"], m, n, k, 1, sms)
        regret = pick[2] / best_opt
        best_vs = rec["cublas_us"] / rec["best_us"]
        regrets.append(regret)
        bests.append(best_vs)
        picks.append(best_vs / regret)
        by_class[rec.get("class", "?")].append((best_vs, best_vs / regret))
        best_label = min(s["opts"], key=lambda o: o[2])
        worst.append((regret, f"{m}x{n}x{k}", select.Choice(pick[0], pick[1], "model").label(),
                      select.Choice(best_label[0], best_label[1], "model").label()))
    r = sorted(regrets)
    return {
        "n": len(r), "regret_median": statistics.median(r), "regret_p90": r[int(0.9 * (len(r) - 1))],
        "regret_worst": r[-1], "best_vs_cublas": gmean(bests), "pick_vs_cublas": gmean(picks),
        "worst": sorted(worst, reverse=True)[:10],
        "classes": {c: (len(v), gmean([x[0] for x in v]), gmean([x[1] for x in v]))
                    for c, v in sorted(by_class.items())},
    }


def model_overrides(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, float]:
    """``--model NAME=VALUE`` (and ``--hbm-tbps V``, its shorthand for
    hbm_tbps) as {name: value}: each name one of the model's real-valued
    constants, each value a finite number above 0, else a usage error that
    names the flag."""
    pairs = [("--hbm-tbps", "hbm_tbps", args.hbm_tbps)] if args.hbm_tbps is not None else []
    for item in args.model:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--model: NAME=VALUE, got {item!r}")
        try:
            pairs.append(("--model", name, float(value)))
        except ValueError:
            ap.error(f"--model {name}: a number, got {value!r}")
    out = {}
    for flag, name, value in pairs:
        if not isinstance(select.MODEL.get(name), float):
            known = ", ".join(k for k, v in select.MODEL.items() if isinstance(v, float))
            ap.error(f"{flag}: {name!r} is not one of the model's real-valued constants ({known})")
        if not 0 < value < float("inf"):
            ap.error(f"{flag} {name}: a value above 0, got {value}")
        out[name] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--worst", action="store_true", help="list the 10 worst picks of each raw")
    ap.add_argument("--hbm-tbps", type=float, default=None,
                    help="replay with the model's effective HBM bandwidth set to this (TB/s; "
                         f"default the fitted {select.MODEL['hbm_tbps']}); --model hbm_tbps=V")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=VALUE",
                    help="replay with one of run/select.py's MODEL constants set to VALUE "
                         "(repeatable; r70 tried sm_gbps for the H100)")
    args = ap.parse_args()
    # Set once, before any replay: the library's model is this process's copy.
    overrides = model_overrides(args, ap)
    select.MODEL.update(overrides)
    # A replay's figures hold for the constants it ran with: say which (r70 left them unsaid).
    print("model constants: " + (", ".join(f"{k}={v:g}" for k, v in sorted(overrides.items()))
                                 + " (overridden; the rest as shipped)" if overrides else "as shipped"))
    for path in args.raw:
        out = replay(path)
        print(f"{path}: n={out['n']} regret median {out['regret_median']:.3f} "
              f"p90 {out['regret_p90']:.3f} worst {out['regret_worst']:.3f}; "
              f"best/cuBLAS {out['best_vs_cublas']:.3f}, pick/cuBLAS {out['pick_vs_cublas']:.3f}")
        for c, (n, b, p) in out["classes"].items():
            print(f"  {c:10s} n={n:3d} best {b:.3f} pick {p:.3f}")
        if args.worst:
            for regret, shape, pick, best in out["worst"]:
                print(f"    {regret:.3f} {shape:>20s} pick {pick} best {best}")


if __name__ == "__main__":
    main()
