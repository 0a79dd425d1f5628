"""Fit the gemv family's model constants (run/select.py GEMV) on recorded timings (CPU only).

Input: ``bench_selection.py --raw`` JSON of the fit sample (every option of
every shape timed on the GPU, cold L2). Grid search over the GEMV constants,
the wgmma model held, with fit_model.py's objective (mean log regret of the
model's pick among the recorded options, a share of the worst, and the
options' squared log error), so the gemv estimates are fitted where they
compete: against the wgmma model's own estimates. Report it on the held-out
sample with replay_selection.py (never fitted on).

The wgmma options' ranking keys do not depend on the GEMV constants, so
they are computed once per shape; each grid point re-estimates only the
gemv options.
"""

from __future__ import annotations

import argparse
import itertools
import math

from fit_model import load, load_decode, objective, summary

from cutlass_aot.run import select

# The resident grid's constants (r40); its raws must time that kernel: a
# raw from before r40 timed a CTA per block of rows, another kernel. r41's
# fit (select.GEMV) came from this grid after a wider one had put
# hbm_share and l2_factor on its edges.
GRID = {
    "hbm_share": (1.06, 1.12, 1.18, 1.25),
    "seg_us": (0.95, 1.05, 1.15),
    "seg_load_us": (0.5, 0.6, 0.7),
    "l2_factor": (4.0, 6.0, 9.0, 14.0),
    "fma_tflops": (6.0,),
    "fixed_us": (-0.75, -0.5, -0.25),
}


def prepare(shapes, sms=132):
    """Per shape: the best wgmma option's (key, µs), every option's µs and
    the wgmma options' squared log error (fixed), and the gemv options."""
    out = []
    for s in shapes:
        m, n, k = s["m"], s["n"], s["k"]
        wg = [(select.rank_key(c, sp, m, n, k, 1, sms), us)
              for c, sp, us in s["opts"] if not c.gemv]
        err = sum(math.log(key[0] / us) ** 2 for key, us in wg)
        gv = [(c, us) for c, sp, us in s["opts"] if c.gemv]
        out.append((m, n, k, min(wg, key=lambda x: x[0]) if wg else None, gv, err, len(s["opts"]),
                    s["best"]))
    return out


def evaluate(prepared, sms=132, w_err=0.05):
    """fit_model.evaluate's objective, from ``prepare``'s cached wgmma keys."""
    regrets, err, n_opts = [], 0.0, 0
    for m, n, k, wg_best, gv, wg_err, count, best in prepared:
        pick_key, pick_us = wg_best if wg_best else (None, None)
        err += wg_err
        n_opts += count
        for c, us in gv:
            key = select.rank_key(c, 1, m, n, k, 1, sms)
            err += math.log(key[0] / us) ** 2
            if pick_key is None or key < pick_key:
                pick_key, pick_us = key, us
        regrets.append(pick_us / best)
    return objective(regrets, err, n_opts, w_err), regrets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+", help="fit-sample raws of bench_selection.py")
    ap.add_argument("--decode", action="append", default=[],
                    help="also fit on a bench_decode.py --raw (the decode grid becomes a "
                         "suite fitted on; report on the held-out sample)")
    args = ap.parse_args()
    shapes = [s for path in args.raw for s in load(path)]
    shapes += [s for path in args.decode for s in load_decode(path)]
    # Only shapes a gemv variant was timed on move the objective.
    prepared = prepare([s for s in shapes if any(c.gemv for c, _, _ in s["opts"])])
    base = dict(select.GEMV)
    obj0, reg0 = evaluate(prepared)
    print(f"{len(prepared)} shapes with gemv options; current constants: objective {obj0:.4f}, "
          f"regret {summary(reg0)}")
    best = (obj0, base, reg0)
    names = list(GRID)
    for values in itertools.product(*GRID.values()):
        select.GEMV.update(zip(names, values))
        obj, reg = evaluate(prepared)
        if obj < best[0]:
            best = (obj, dict(select.GEMV), reg)
    select.GEMV.update(base)
    obj, g, reg = best
    print(f"fitted {g}: objective {obj:.4f}, regret {summary(reg)}")


if __name__ == "__main__":
    main()
