"""The row-above rule (select.row_above, r65) against its absence, timed together at held-out token counts.

Dispatch serves a problem the selection table has no row for from the row
below whose tiles cover it, then (since r65) from a row above whose tiles
cover it within ``select.ROW_ABOVE_BOUND`` of the row below, then by the
model. This script draws a seeded sample held out from the manifest's
``tune:`` problems (``with_c_edge.held_out_sample``: at each tuned (N, K)
width in turn, M log-uniform over 1..``--max-m``, never a tuned problem),
and for each shape launches, interleaved under CUDA graph replay over cold
operand sets (``tune.timing.interleaved``):

* new: ``select.choose(..., above=True)``, every rule (what dispatch runs for a residual call);
* old: ``select.choose(..., above=False)``, without rule 3 (what dispatch runs for a plain call);
* cuBLAS: ``torch.mm``, or with ``--with-c`` ``torch.addmm(c, a, b)``.

Both picks launch through ``dispatch.launch_choice`` (with C, beta 1, as
``tune`` times residual rows), the table bound as the cache binds it on
this GPU. The new pick's result is checked against an fp32 reference on a
poisoned ``out`` first. The report gives new / old over the shapes the rule
moves, and each against cuBLAS over the whole sample.

    python3 benchmarks/row_above_ab.py [--with-c] [--dtype bf16] [--sample 32] [--seed 65]
        [--manifest configs/sm90.yaml] [--max-m 16384] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

import torch
from _common import gmean, header, max_rel_err, write
from with_c_edge import held_out_sample, tuned_problems

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import TORCH_DTYPES, copies_for, interleaved, l2_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--with-c", action="store_true", help="residual calls (D = A·B + C)")
    ap.add_argument("--sample", type=int, default=32)
    ap.add_argument("--seed", type=int, default=65)
    ap.add_argument("--manifest", default=str(Path(__file__).resolve().parents[1] / "configs"
                                              / "sm90.yaml"), help="whose tune: the sample avoids")
    ap.add_argument("--max-m", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.sample < 1 or args.max_m < 1 or args.rounds < 1:
        ap.error("--sample, --max-m and --rounds must be at least 1")
    tuned = tuned_problems(args.manifest, args.dtype, args.with_c)
    if not tuned:
        raise SystemExit(f"row_above_ab.py: {args.manifest} tunes no such problem in {args.dtype}")
    shapes = held_out_sample(tuned, args.sample, args.seed, args.max_m)

    cache = cutlass_aot.open_cache(args.cache_dir)
    arch, sms, gpu_name, cc = device_info(0)
    dn = args.dtype
    sig = gemm_signature(arch, a=dn, b=dn, d=dn, c=dn if args.with_c else None, a_major="k",
                         b_major="k", d_major="n", rank=2)
    cands = cache.gemm.runner._candidates_for(sig)
    rows = cache.table_rows(sig, gpu_name, sms, cc) or {}
    if not rows:
        raise SystemExit(f"row_above_ab.py: the cache's table has no row for {sig.text()} on {gpu_name}")
    dt = TORCH_DTYPES[dn]
    lines, moved, vs_ref = [], [], {"new": [], "old": []}
    for m, n, k in shapes:
        new = select.choose(cands, m, n, k, 1, sms, rows, above=True)
        old = select.choose(cands, m, n, k, 1, sms, rows, above=False)
        count = copies_for(2 * (m * k + n * k + (2 if args.with_c else 1) * m * n), l2_bytes(0))
        sets = []
        for _ in range(count):
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(n, k, device="cuda", dtype=dt).t()
            c = torch.randn(m, n, device="cuda", dtype=dt) if args.with_c else None
            sets.append((a, b, c, torch.empty(m, n, device="cuda", dtype=dt)))
        run_new = launch_choice(cache, new, sms, m, n, 1, k=k)
        run_old = launch_choice(cache, old, sms, m, n, 1, k=k)
        a, b, c, out = sets[0]
        out.fill_(float("nan"))
        run_new(a, b, out, c)
        ref = a.float() @ b.float() + (c.float() if c is not None else 0.0)
        err = max_rel_err(out, ref)
        if not err < 2e-2:  # NaN fails too
            raise SystemExit(f"row_above_ab.py: {m}x{n}x{k}: the new pick's result is off "
                             f"(max relative error {err})")

        def cublas(a, b, c, out):
            if c is None:
                torch.mm(a, b, out=out)
            else:
                torch.addmm(c, a, b, out=out)

        # sets hold (a, b, c, out); ours take (a, b, out, c)
        fns = [[functools.partial(run_new, s[0], s[1], s[3], s[2]) for s in sets],
               [functools.partial(run_old, s[0], s[1], s[3], s[2]) for s in sets],
               [functools.partial(cublas, *s) for s in sets]]
        t_new, t_old, t_ref = interleaved(fns, rounds=args.rounds, graph=True)
        vs_ref["new"].append(t_ref / t_new)
        vs_ref["old"].append(t_ref / t_old)
        if (new.candidate, new.splits) != (old.candidate, old.splits):
            moved.append(t_new / t_old)
        lines.append(f"| {m}x{n}x{k} | {new.source} | {t_old:.1f} | {t_new:.1f} | {t_new / t_old:.3f} | "
                     f"{t_ref:.1f} | {t_ref / t_new:.3f} | {t_ref / t_old:.3f} | {err:.1e} | "
                     f"{new.label()} | {old.label()} |")
        print(lines[-1], flush=True)
        del sets, a, b, c, out, fns
        torch.cuda.empty_cache()

    what = "residual (D = A·B + C)" if args.with_c else "plain (D = A·B)"
    ref_name = "`addmm`" if args.with_c else "`mm`"
    text = header(f"The row-above rule, {what} {args.dtype}: dispatch with and without it, and cuBLAS")
    text += (f"CUDA graph replay over cold operand sets, {args.rounds} rounds interleaved (new, old, "
             f"cuBLAS {ref_name}), in reverse order every other round; µs per call, median of rounds. "
             "new: `select.choose` with every rule (r65: a row above within "
             f"{select.ROW_ABOVE_BOUND}x of the row below); old: without the row-above rule. "
             f"Shapes: {args.sample} held out from {Path(args.manifest).name}'s tune: problems at their "
             f"widths, seed {args.seed}, M log-uniform 1..{args.max_m}; table rows of {gpu_name}.\n\n")
    text += (f"- shapes the rule moves: {len(moved)} of {len(shapes)}"
             + (f", new / old geomean {gmean(moved):.3f}, worst {max(moved):.3f}, best {min(moved):.3f}"
                if moved else "") + "\n"
             f"- vs cuBLAS, geomean over all: new {gmean(vs_ref['new']):.3f}, old {gmean(vs_ref['old']):.3f}\n\n")
    text += ("| MxNxK | new source | old µs | new µs | new / old | cuBLAS µs | cuBLAS / new | cuBLAS / old "
             "| max rel err (new) | new pick | old pick |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    print(text)
    print("wrote", write("row_above_ab.md", text, args.out))


if __name__ == "__main__":
    main()
