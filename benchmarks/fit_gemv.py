"""Fit the gemv family's model constants (run/select.py GEMV) on recorded timings (CPU only).

Input: ``bench_selection.py --raw`` JSON of the fit sample (every option of
every shape timed on the GPU, cold L2). Grid search over the GEMV constants,
the wgmma model held, with fit_model.py's objective (mean log regret of the
model's pick among the recorded options, a share of the worst, and the
options' squared log error), so the gemv estimates are fitted where they
compete: against the wgmma model's own estimates. Report it on the held-out
sample with replay_selection.py (never fitted on).
"""

from __future__ import annotations

import argparse
import itertools

from fit_model import evaluate, load, summary

from cutlass_aot.run import select


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+", help="fit-sample raws of bench_selection.py")
    args = ap.parse_args()
    shapes = [s for path in args.raw for s in load(path)]
    # Only shapes a gemv variant was timed on move the objective.
    shapes = [s for s in shapes if any(c.gemv for c, _, _ in s["opts"])]
    base = dict(select.GEMV)
    obj0, reg0 = evaluate(shapes)
    print(f"{len(shapes)} shapes with gemv options; current constants: objective {obj0:.4f}, "
          f"regret {summary(reg0)}")
    best = (obj0, base, reg0)
    for share, cta, fma, fixed in itertools.product(
            (0.95, 1.0, 1.05, 1.1, 1.2), (2.0, 3.0, 4.0, 6.0), (6.0, 8.0, 12.0),
            (-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)):
        select.GEMV.update(hbm_share=share, cta_gbps=cta, fma_tflops=fma, fixed_us=fixed)
        obj, reg = evaluate(shapes)
        if obj < best[0]:
            best = (obj, dict(select.GEMV), reg)
    select.GEMV.update(base)
    obj, g, reg = best
    print(f"fitted {g}: objective {obj:.4f}, regret {summary(reg)}")


if __name__ == "__main__":
    main()
