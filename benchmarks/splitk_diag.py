"""Do a split-K variant's whole waves run slower than its plain sibling's? (GPU)

splitk_wave_check.py found, in recorded timings, that a split-K variant at
its best split count takes 1.03-1.15x its plain sibling's time on problems of
3 to 10 waves, where the hybrid splits only the last partial wave. This
script separates the two explanations on the GPU:

* ``whole`` shapes fill whole waves exactly (tiles = k x cluster slots):
  the split-K variant has no tail, so it runs the plain variant's work plus
  an empty reduce launch. A ratio above 1 here is the whole waves' cost.
* ``tail`` shapes add a partial wave, which split-K splits 2..8 ways.

Every variant is timed under CUDA graph replay (device time, warm L2),
interleaved with its sibling in rounds, median per variant.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from _common import header, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import interleaved


def tile_key(c):
    return (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--k", default="2048,8192")
    ap.add_argument("--waves", default="1,3,6")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    cache = cutlass_aot.open_cache(args.cache_dir)
    runner = cache.gemm.runner
    arch, sms, _, _ = device_info(0)
    sig = gemm_signature(arch, a="bf16", b="bf16", d="bf16", c=None, a_major="k", b_major="k",
                         d_major="n", rank=2)
    cands = runner._candidates_for(sig)
    plain = {tile_key(c): c for c in cands
             if not c.split_k and not c.swap_ab and (c.raster, c.swizzle) == ("m", 1)}
    split = {tile_key(c): c for c in cands if c.split_k and not c.swap_ab}
    pairs = [(plain[t], split[t]) for t in sorted(split) if t in plain]

    lines = []
    for p, s in pairs:
        slots = sms // (p.cluster_m * p.cluster_n)
        # Tile counts: cluster tiles = slots * waves, as an (m, n) grid with
        # n fixed so that N is model-like.
        tn_cl = 4
        for waves in (int(w) for w in args.waves.split(",")):
            for kind, extra in (("whole", 0), ("tail", slots // 3)):
                cl_tiles = slots * waves + extra
                tm_cl = -(-cl_tiles // tn_cl)
                m = tm_cl * p.tile_m * p.cluster_m
                n = tn_cl * p.tile_n * p.cluster_n
                for k in (int(x) for x in args.k.split(",")):
                    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                    b, out = w.t(), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    splits = select.split_choices(s, m, n, k, 1, None)
                    opts = [select.Choice(p, 1, "diag")]
                    opts += [select.Choice(s, x, "diag") for x in (splits[:1] if kind == "whole"
                                                                   else splits[:3])]
                    fns = [launch_choice(cache, o, sms, m, n, 1, k=k) for o in opts]
                    try:
                        ts = interleaved([lambda f=f: f(a, b, out) for f in fns], rounds=5, reps=3,
                                         graph=True)
                    except Exception as exc:  # noqa: BLE001 - a diagnostic reports and goes on
                        print(f"{m}x{n}x{k} {[o.label() for o in opts]}: {exc}", flush=True)
                        continue
                    ref = torch.mm(a, b)
                    fns[-1](a, b, out)
                    torch.cuda.synchronize()
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    ratios = " ".join(f"{o.splits}:{t / ts[0]:.3f}" for o, t in zip(opts[1:], ts[1:]))
                    line = (f"| {p.tile_m}x{p.tile_n}/{p.cluster_m}x{p.cluster_n} | {kind} | "
                            f"{cl_tiles / slots:.2f} | {m}x{n}x{k} | {ts[0]:.1f} | {ratios} | {err:.1e} |")
                    print(line, flush=True)
                    lines.append((kind, [t / ts[0] for t in ts[1:]], line))
    text = header("Split-K variants against their plain siblings: whole waves and tails")
    text += ("time(split-K variant, split count) / time(plain sibling, same tile and cluster), "
             "CUDA graph replay, interleaved 5 rounds x 3 reps, median. 'whole': tiles fill "
             "whole waves (no tail: split-K runs the plain work plus an empty reduce launch). "
             "'tail': a third of a wave more, which split-K splits.\n\n")
    for kind in ("whole", "tail"):
        rs = [min(r) for k_, r, _ in lines if k_ == kind and r]
        if rs:
            text += (f"- {kind}: best split-K / plain median {statistics.median(rs):.3f}, "
                     f"min {min(rs):.3f}, max {max(rs):.3f} (n={len(rs)})\n")
    text += ("\n| tile/cluster | kind | waves | MxNxK | plain µs | split:ratio | rel err |\n"
             "|---|---|---|---|---|---|---|\n")
    text += "\n".join(line for _, _, line in lines) + "\n"
    write("splitk_diag", text, args.out)


if __name__ == "__main__":
    main()
