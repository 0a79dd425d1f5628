"""nvMatmulHeuristics as the selection model, replayed on recorded timings (CPU only).

An experiment, not part of the package: it needs ``pip install
nvidia-matmul-heuristics`` (NVIDIA's analytic GEMM heuristics, PyPI). For
each shape of a ``bench_selection.py --raw`` sample it asks nvMatmulHeuristics
(CUTLASS3 target, H200_SXM, precision TST/HSH, NT row-major layout) for the
estimated runtime of every recorded option of ours, described as a CUTLASS 3
kernel configuration (CTA tile, cluster, split-K count, stages from our
shared-memory budget; swap-AB as the transposed problem), and picks the
fastest estimate. Options it cannot describe (it returns 0: narrow N tiles)
fall back to our model's estimate scaled to nvMatmulHeuristics' scale on
that shape, so every shape gets a pick. Reports regret and pick / cuBLAS next
to our own model (run/select.py) on the same recorded timings.

Caveat: its split-K is CUTLASS's (every tile split), ours is a
data-parallel + split-K hybrid; the configuration maps only the count.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics

import nvMatmulHeuristics as nv
from _common import load_raw
from fit_model import parse

from cutlass_aot.run import select

_SMEM = 227 * 1024


def _stages(tm: int, tn: int) -> int:
    return max(2, min(8, (_SMEM - 8192) // ((tm + tn) * 64 * 2)))


class Nvmmh:
    def __init__(self) -> None:
        self.i = nv.NvMatmulHeuristicsInterfaceEx(
            backend=nv.NvMatmulHeuristicsTarget.CUTLASS3, gpu=nv.NvMatmulHeuristicsNvidiaGpu.H200_SXM)
        self.layout = nv.NvMatmulHeuristicsMatmulLayout.NT_ROW_MAJOR

    def estimate_us(self, c: select.Candidate, splits: int, m: int, n: int, k: int,
                    precision: bytes) -> float:
        i = self.i
        i._ensure_discovery_loaded(i.target, precision.decode(), self.layout)
        if c.swap_ab:
            m, n = n, m
        prob = i.makeNvMatmulHeuristicsProblem(m, n, k, self.layout)
        cfg = i.nvmmhKernelConfiguration()
        cfg.cta[:] = (c.tile_m, c.tile_n, 64)
        cfg.warp[:] = (64, min(64, c.tile_n), 32)
        cfg.instr[:] = (64, 8, 16)
        cfg.splitK = splits
        cfg.loadStages = _stages(c.tile_m, c.tile_n)
        cfg.gridSwizzle = c.swizzle
        cfg.ctaOrder = 1 if c.raster == "m" else 0
        cfg.cluster[:] = (c.cluster_m, c.cluster_n)
        return i.nvMatmulHeuristicsEstimateRuntime(
            i.handle, precision, ctypes.c_int(i.target), ctypes.byref(prob), ctypes.byref(cfg),
            i.hardware_descriptor) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+")
    args = ap.parse_args()
    h = Nvmmh()
    for path in args.raw:
        recs = load_raw(path)
        shapes = parse(recs)
        out = {"nvmmh": ([], []), "ours": ([], [])}
        described = total = 0
        for rec, s in zip(recs, shapes):
            m, n, k = s["m"], s["n"], s["k"]
            prec = b"TST" if rec["dtype"] == "bf16" else b"HSH"
            ours = {id(o): select.estimate_us(o[0], o[1], m, n, k, 1, 132) for o in s["opts"]}
            theirs = {id(o): h.estimate_us(o[0], o[1], m, n, k, prec) for o in s["opts"]}
            valid = [o for o in s["opts"] if theirs[id(o)] > 0]
            described += len(valid)
            total += len(s["opts"])
            # Put our model's estimates for the rest on their scale.
            scale = (statistics.median(theirs[id(o)] / ours[id(o)] for o in valid) if valid else 1.0)
            est = {key: (theirs[key] if theirs[key] > 0 else ours[key] * scale) for key in theirs}
            best_vs = rec["cublas_us"] / rec["best_us"]
            for name, table in (("nvmmh", est), ("ours", ours)):
                pick = min(s["opts"], key=lambda o, t=table: t[id(o)])
                regret = pick[2] / s["best"]
                out[name][0].append(regret)
                out[name][1].append(best_vs / regret)
        print(f"{path}: {len(shapes)} shapes; nvMatmulHeuristics described {described} of {total} options")
        for name, (reg, vs) in out.items():
            r = sorted(reg)
            g = math.exp(sum(map(math.log, vs)) / len(vs))
            print(f"  {name:6s} regret median {statistics.median(r):.3f} p90 {r[int(0.9 * (len(r) - 1))]:.3f} "
                  f"worst {r[-1]:.3f}; pick/cuBLAS {g:.3f}")


if __name__ == "__main__":
    main()
