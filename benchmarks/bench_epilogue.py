"""Fused epilogues against torch: bias and bias + GELU GEMMs at the llm shapes.

For each llm shape of shapes.yaml (A row-major [M,K], B = w.t(), D row-major;
the nn.Linear layout) and each dtype, times, interleaved over 3 rounds:

* ours: ``cache.gemm(a, w.t(), out, bias=bias, act=act)`` (the public call,
  dispatch included), with the epilogue fused into the GEMM;
* torch unfused: ``torch.addmm(bias, a, w.t(), out=tmp)`` then, for GELU,
  ``F.gelu(tmp, approximate="tanh")`` (two kernels, D written and re-read);
* torch fused (reported, not the goal's baseline):
  ``torch._addmm_activation(bias, a, w.t(), use_gelu=True)`` (cuBLASLt's
  GELU epilogue) for bias+GELU, the plain addmm for bias.

The goal (issue 11) is a geometric mean >= 1.05x over the unfused path.
Shapes whose signature the cache does not serve are listed as such.

'ceiling' is what fusion alone can give at a shape: the unfused path's time
over addmm's alone (timed in the same rounds), that is, the ratio of a fused
call whose GEMM runs exactly as fast as cuBLAS's addmm and whose epilogue
costs nothing. For bias alone it is 1 (addmm already fuses the bias).

``--harness`` picks how a call is timed. ``eager`` (the default, as every
round since r20 reported): back-to-back eager launches on one operand set,
CUDA events, warm L2. ``graph``: the rules of tune.timing that the other
benchmarks and the tune follow: CUDA graph replay of back-to-back calls, each
on an operand set no call touched for two L2-fulls (cold weights, as a layer
of a model finds them), round-robin over the five paths. The two can rank
options differently (harness_ab.py); the table's rows were tuned under
``graph``.

Shapes: ``--group`` names a shapes.yaml group (default llm: the table's own
epilogue rows were tuned there); ``--sample heldout`` draws a seeded random
sample instead (seed 4004, never tuned or fitted on: M log-uniform over
256..16384, N and K multiples of 64 log-uniform over 1024..28672, at most 2
TFLOP a call), so a table tuned on the llm shapes is checked off them.

    python3 benchmarks/bench_epilogue.py [--cache-dir DIR] [--group G | --sample heldout]
        [--count 12] [--dtypes bf16,f16] [--harness eager|graph] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from _common import gmean, header, seconds, write

import cutlass_aot
from cutlass_aot.run.servable import gemm_signature, serves, serving_index
from cutlass_aot.signature import ARCH_BY_CAPABILITY
from cutlass_aot.tune.timing import cold_operands, interleaved

HERE = Path(__file__).resolve().parent
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}
HELDOUT_SEED = 4004


def heldout_sample(count: int, seed: int = HELDOUT_SEED) -> list[list[int]]:
    """The seeded random epilogue sample (module docstring)."""
    rng = random.Random(seed)

    def logu(lo: int, hi: int) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    out: list[list[int]] = []
    while len(out) < count:
        m = int(logu(256, 16384))
        n, k = (int(logu(1024, 28672)) // 64 * 64 for _ in range(2))
        if 2 * m * n * k <= 2e12:
            out.append([m, n, k])
    return out



def _paths(cache, act: str) -> tuple:
    """The timed paths as functions of one operand set ``(a, b, out, bias, tmp)``:
    (unfused, ours, torch fused, our plain, addmm). For bias alone the unfused
    and torch fused paths are addmm itself (module docstring)."""
    fused_act = None if act == "none" else act

    def ours(a, b, out, bias, tmp):
        cache.gemm(a, b, out, bias=bias, act=fused_act)

    def plain(a, b, out, bias, tmp):
        cache.gemm(a, b, out)

    def addmm(a, b, out, bias, tmp):
        torch.addmm(bias, a, b, out=tmp)

    if act == "none":
        return addmm, ours, addmm, plain, addmm

    def unfused(a, b, out, bias, tmp):
        F.gelu(torch.addmm(bias, a, b, out=tmp), approximate="tanh")

    def fused(a, b, out, bias, tmp):
        torch._addmm_activation(bias, a, b, use_gelu=True)

    return unfused, ours, fused, plain, addmm


def _graph_times(paths: tuple, dt, dname: str, m: int, n: int, k: int, act: str) -> list[float]:
    """µs per call of ``_paths``' (unfused, ours, torch fused, our plain, addmm)
    under ``--harness graph`` (module docstring): tune.timing's cold operand
    sets, each with its own bias and addmm output, timed round-robin over 3
    rounds by CUDA graph replay. For bias alone addmm is the unfused path's time."""
    sets = cold_operands((dname, dname, dname, "k", "k", "n", 2), m, n, k, 1)
    extra = [(torch.randn(n, device="cuda", dtype=dt), torch.empty(m, n, device="cuda", dtype=dt))
             for _ in sets]
    timed = paths[:4] if act == "none" else paths
    us = interleaved([[functools.partial(f, a, b, out, bias, tmp)
                       for (a, b, out), (bias, tmp) in zip(sets, extra)] for f in timed],
                     rounds=3, graph=True)
    return us if act != "none" else [*us, us[0]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--shapes", default=str(HERE / "shapes.yaml"))
    ap.add_argument("--group", default="llm")
    ap.add_argument("--sample", choices=["heldout"], default=None,
                    help="a seeded random sample instead of --group (module docstring)")
    ap.add_argument("--count", type=int, default=12, help="shapes in --sample")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--harness", choices=["eager", "graph"], default="eager",
                    help="how a call is timed (module docstring)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache = cutlass_aot.open_cache(args.cache_dir)
    index = serving_index(cache.by_signature)
    cap = torch.cuda.get_device_capability(0)
    arch = ARCH_BY_CAPABILITY.get(cap, f"sm_{cap[0]}{cap[1]}")
    if args.sample:
        shapes, title = heldout_sample(args.count), f"seeded held-out sample, seed {HELDOUT_SEED}"
    else:
        shapes, title = yaml.safe_load(Path(args.shapes).read_text())[args.group], f"{args.group} shapes"
    lines, summary = [], []
    every: dict[str, list] = {}  # dtype -> every shape's ratio vs unfused, both epilogues
    ceilings: dict[str, list] = {}  # dtype -> every shape's fusion ceiling, both epilogues
    for dname in args.dtypes.split(","):
        dt = TORCH[dname]
        for act in ("none", "gelu"):
            epi = "bias" if act == "none" else "bias+gelu"
            if not serves(index, gemm_signature(arch, a=dname, bias=dname, act=act)):
                summary.append(f"| {dname} | {epi} | not in the cache | | | |")
                continue
            ratios, fused_ratios, plain_ratios, ceils = [], [], [], []
            for m, n, k in shapes:
                a = torch.randn(m, k, device="cuda", dtype=dt)
                w = torch.randn(n, k, device="cuda", dtype=dt) / math.sqrt(k)
                bias = torch.randn(n, device="cuda", dtype=dt)
                out = torch.empty(m, n, device="cuda", dtype=dt)
                tmp = torch.empty(m, n, device="cuda", dtype=dt)
                b = w.t()
                paths = _paths(cache, act)
                unfused, ours, fused, plain, addmm = (functools.partial(f, a, b, out, bias, tmp)
                                                      for f in paths)
                ours()
                choice = cache.gemm.runner.choice_for(a, b, out, bias=bias,
                                                      act=None if act == "none" else act)
                ref = F.gelu(torch.addmm(bias.float(), a.float(), b.float()), approximate="tanh") \
                    if act == "gelu" else torch.addmm(bias.float(), a.float(), b.float())
                err = ((out.float() - ref).norm() / ref.norm()).item()
                iters = max(3, min(200, int(2e12 / (2.0 * m * n * k))))
                rs, fs, ps, cs, ts = [], [], [], [], []
                if args.harness == "graph":
                    us = _graph_times(paths, dt, dname, m, n, k, act)
                    t_unf, t_ours, t_fus, t_plain, t_addmm = (x * 1e-6 for x in us)
                    rs, fs, ps, cs = ([t_unf / t_ours], [t_fus / t_ours], [t_ours / t_plain],
                                      [t_unf / t_addmm])
                    ts.append((t_ours, t_unf, t_fus, t_plain))
                else:
                    for _ in range(3):  # interleaved rounds: clocks drift over a shape's seconds
                        t_unf = seconds(unfused, iters)
                        t_ours = seconds(ours, iters)
                        t_fus = seconds(fused, iters)
                        t_plain = seconds(plain, iters)
                        t_addmm = t_unf if act == "none" else seconds(addmm, iters)
                        rs.append(t_unf / t_ours)
                        fs.append(t_fus / t_ours)
                        ps.append(t_ours / t_plain)
                        cs.append(t_unf / t_addmm)
                        ts.append((t_ours, t_unf, t_fus, t_plain))
                r, fr, pr, cr = (statistics.median(x) for x in (rs, fs, ps, cs))
                t_ours, t_unf, t_fus, t_plain = (statistics.median(x) for x in zip(*ts))
                ratios.append(r)
                fused_ratios.append(fr)
                plain_ratios.append(pr)
                ceils.append(cr)
                every.setdefault(dname, []).append(r)
                ceilings.setdefault(dname, []).append(cr)
                lines.append(f"| {dname} | {epi} | {m}x{n}x{k} | {choice.label()} ({choice.source}) "
                             f"| {t_ours * 1e6:.1f} | {t_plain * 1e6:.1f} | {t_unf * 1e6:.1f} | "
                             f"{t_fus * 1e6:.1f} | {r:.2f} | {cr:.2f} | {fr:.2f} | {pr:.3f} | {err:.1e} |")
                print(lines[-1], flush=True)
            g = gmean(ratios)
            gf = gmean(fused_ratios)
            gp = gmean(plain_ratios)
            gc = gmean(ceils)
            summary.append(f"| {dname} | {epi} | {g:.3f} | {min(ratios):.2f} | {gc:.3f} | {gf:.3f} | "
                           f"{gp:.3f} | {'met' if g >= 1.05 else 'not met'} |")
    where = title if args.harness == "eager" else f"{title}, graph replay, cold L2"
    text = header(f"Fused bias / bias+GELU epilogues vs torch ({where})")
    timing = ("CUDA events over back-to-back eager launches on one operand set (warm L2; median of "
              "5 reps), 3 interleaved rounds, median ratio per shape" if args.harness == "eager" else
              "CUDA graph replay of back-to-back calls, each on an operand set no call touched for two "
              "L2-fulls (cold L2; tune.timing's rules), the five paths round-robin over 3 rounds, "
              "ratio of median times")
    text += (f"Harness: {args.harness}. A row-major, B = w.t(), D row-major. µs per GEMM from {timing}. "
             "'unfused' = addmm (cuBLAS bias epilogue) "
             "then F.gelu(tanh); 'torch fused' = torch._addmm_activation(use_gelu=True) (cuBLASLt GELU "
             "epilogue; for bias it is the same addmm). Ratios > 1: ours is faster. Error: relative "
             "Frobenius vs fp32 torch.\n\n")
    text += ("'ours / our plain' is the fused call's time over our own plain GEMM's (the dispatcher's "
             "pick without bias), measured in the same rounds: what the epilogue itself costs.\n\n")
    text += ("'ceiling' (module docstring): unfused over addmm alone, in the same rounds: what a "
             "free epilogue on a GEMM as fast as cuBLAS's would give.\n\n")
    text += ("| dtype | epilogue | geomean vs unfused | lowest | ceiling (geomean) | "
             "geomean vs torch fused | ours / our plain | goal >= 1.05x |\n"
             "|---|---|---|---|---|---|---|---|\n" + "\n".join(summary) + "\n\n")
    for dname, rs in every.items():
        text += (f"- {dname}, bias and bias+GELU together: geomean {gmean(rs):.3f} vs unfused, "
                 f"ceiling {gmean(ceilings[dname]):.3f} (n={len(rs)})\n")
    text += ("\n| dtype | epilogue | MxNxK | pick (table row or model) | ours µs | our plain µs | "
             "unfused µs | torch fused µs | vs unfused | ceiling | vs torch fused | ours / our plain "
             "| rel err |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(text)
    print("wrote", write("epilogue.md", text, args.out))


if __name__ == "__main__":
    main()
