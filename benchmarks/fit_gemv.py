"""Fit the gemv family's model constants (run/select.py GEMV) on recorded timings (CPU only).

Input: ``bench_decode.py --raw`` JSON (every option's CUDA-graph time per
decode problem, cold L2). Grid search over the GEMV constants. What the
dispatcher needs is the gemv options' time *relative to the other options as
the model estimates them* (the wgmma model has biases of its own), so the
objective is the mean squared log error of gemv time / the fastest other
option's time, modelled against measured, per (problem, gemv option); only
single-pass options (M <= the variant's tokens) count. It then replays the
selection on the same rows: regret of the model's pick among the recorded
options, with and without the gemv options.
The held-out check is bench_selection.py's held-out sample, which this fit
never sees.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

from cutlass_aot.run import select


def _cand(label: str) -> select.Candidate:
    t, r = (int(x) for x in label[4:].split("x"))
    return select.Candidate(label, t, r, 1, 1, gemv=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--replay-only", action="store_true",
                    help="no fit: replay the selection with run/select.py's GEMV as it is")
    args = ap.parse_args()
    rows = [r for path in args.raw for r in json.load(open(path))]
    pts = []
    for r in rows:
        m, n, k = r["m"], r["n"], r["k"]
        other = min((us, label) for label, us in r["options"] if not label.startswith("gemv"))
        cand = _other(other[1], m, n, k)
        if cand is None:
            continue
        other_est = select.estimate_us(cand[0], cand[1], m, n, k, 1, 132)
        for label, us in r["options"]:
            if label.startswith("gemv") and m <= _cand(label).tile_m:
                pts.append((_cand(label), m, n, k, us / other[0], other_est))
    best = None
    for share, cta, fma, fixed, step in itertools.product(
            (0.95, 1.0, 1.05, 1.1, 1.2), (2.0, 3.0, 4.0),
            (6.0, 8.0, 12.0), (-1.0, 0.0, 1.0, 2.0, 3.0), (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)):
        g = dict(select.GEMV, hbm_share=share, cta_gbps=cta, fma_tflops=fma, fixed_us=fixed,
                 step_us=step)
        err = sum(math.log(select.gemv_estimate_us(c, m, n, k, 1, 132, gemv=g) / o_est / ratio) ** 2
                  for c, m, n, k, ratio, o_est in pts) / len(pts)
        if best is None or err < best[0]:
            best = (err, g)
    err, g = best
    if args.replay_only:
        g = dict(select.GEMV)
    print(f"{len(pts)} single-pass gemv timings; fitted {g}; relative mean squared log error "
          f"{err:.4f}")
    for use_gemv in (False, True):
        regrets = []
        for r in rows:
            m, n, k = r["m"], r["n"], r["k"]
            opts = [(label, us) for label, us in r["options"]
                    if use_gemv or not label.startswith("gemv")]
            est = {}
            for label, _ in opts:
                if label.startswith("gemv"):
                    est[label] = select.gemv_estimate_us(_cand(label), m, n, k, 1, 132, gemv=g)
                else:
                    cand = _other(label, m, n, k)
                    if cand is not None:
                        est[label] = select.estimate_us(cand[0], cand[1], m, n, k, 1, 132)
            pick = min(est, key=est.get)
            times = dict(opts)
            regrets.append(times[pick] / min(times.values()))
            if use_gemv and m <= 2:
                print(f"  {r['dtype']} {m:3d} {n:6d} {k:6d} pick {pick:28s} {times[pick]:7.1f} "
                      f"best {min(times, key=times.get):28s} {min(times.values()):7.1f}")
        gm = math.exp(sum(map(math.log, regrets)) / len(regrets))
        print(f"model pick among recorded options {'with' if use_gemv else 'without'} gemv: "
              f"regret geomean {gm:.3f}, worst {max(regrets):.3f} (n={len(regrets)})")


def _other(label: str, m: int, n: int, k: int):
    """(candidate, splits) of a wgmma option label as bench_decode writes it."""
    parts = label.split("/")
    tm, tn = (int(x) for x in parts[0].split("x"))
    cm, cn = (int(x) for x in parts[1].split("x"))
    raster, swizzle = parts[2][0], int(parts[2][1:])
    rest = parts[3:]
    splits = 1
    split = False
    for p in rest:
        if p.startswith("splitk"):
            split = True
            splits = int(p[7:]) if len(p) > 6 else 1
    c = select.Candidate(label, tm, tn, cm, cn, raster, swizzle, "swap" in rest, split,
                         pingpong="pp" in rest)
    return c, splits


if __name__ == "__main__":
    main()
