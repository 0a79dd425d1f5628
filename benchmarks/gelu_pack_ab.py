"""The GELU epilogue's tanh packed two to a MUFU op, against the fp32 tanh and the bias alone.

sm90_gemm's ``gelu_tanh`` parameter (r37's experiment): ``x2`` rounds each
pair of pre-activations to bf16 and takes both tanh in one
``tanh.approx.bf16x2``, where ``f32`` takes one ``tanh.approx.f32`` an element.
For every schedule the cache builds with a bias, with bias+GELU in both
forms, this times the three together at the shape suite's llm shapes
(nn.Linear layout, interleaved, CUDA graph replay, cold L2) and measures each
GELU form's error against an fp32 torch reference on 1024 rows of each
shape. Reported: t(x2) / t(f32), and what each GELU form costs over the bias
alone (t(gelu) / t(bias)).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from _common import gmean, header, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import cold_operands, interleaved, rotate

SHAPES = ((1024, 6144, 4096), (1024, 4096, 4096), (1024, 28672, 4096), (1024, 4096, 14336),
          (4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336),
          (16384, 6144, 4096), (16384, 4096, 4096), (16384, 28672, 4096), (16384, 4096, 14336))


def by_schedule(cands: list[select.Candidate], packed: bool) -> dict[tuple, select.Candidate]:
    return {c.schedule: c for c in cands if (("gelu_tanh", "x2") in c.extra) == packed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache = cutlass_aot.open_cache(args.cache_dir)
    arch, sms, _, _ = device_info(0)
    lines, ratios, costs = [], {}, {}
    for dt in args.dtypes.split(","):
        sig = dict(arch=arch, a=dt, b=dt, d=dt, c=None, a_major="k", b_major="k", d_major="n",
                   rank=2, bias=dt)
        plain = {c.schedule: c for c in cache.gemm.runner._candidates_for(gemm_signature(**sig))}
        gelu = cache.gemm.runner._candidates_for(gemm_signature(**sig, act="gelu"))
        f32s, x2s = by_schedule(gelu, False), by_schedule(gelu, True)
        scheds = [s for s in x2s if s in f32s and s in plain]
        if not scheds:
            sys.exit(f"{args.cache_dir}: no {dt} schedule has a bias variant and both GELU forms")
        for m, n, k in SHAPES:
            sets = cold_operands((dt,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
            bias = torch.randn(n, device="cuda", dtype=sets[0][0].dtype)
            for s in scheds:
                cands = (plain[s], f32s[s], x2s[s])
                choices = [select.Choice(c, select.split_choices(c, m, n, k, 1, sms)[0], "bench")
                           for c in cands]
                fs = [launch_choice(cache, ch, sms, m, n, 1, bias, k=k) for ch in choices]
                t_bias, t_f32, t_x2 = interleaved([rotate(f, sets) for f in fs],
                                                  rounds=args.rounds, graph=True)
                # Error on the first 1024 rows against fp32 torch, each form.
                a, b, _ = sets[0]
                rows = min(m, 1024)
                ref = torch.nn.functional.gelu(a[:rows].float() @ b.float() + bias.float(),
                                               approximate="tanh")
                errs = []
                for f in fs[1:]:
                    o = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
                    f(a, b, o)
                    d = o[:rows].float() - ref
                    if not torch.isfinite(o).all():
                        sys.exit(f"{dt} {m}x{n}x{k}: a GELU form left NaN or inf in out")
                    errs.append((float(d.norm() / ref.norm()),
                                 float(d.abs().max() / ref.abs().max())))
                label = choices[1].label()
                ratios.setdefault(dt, []).append(t_x2 / t_f32)
                costs.setdefault((dt, "f32"), []).append(t_f32 / t_bias)
                costs.setdefault((dt, "x2"), []).append(t_x2 / t_bias)
                lines.append(f"| {dt} | {m}x{n}x{k} | {label} | {t_bias:.1f} | {t_f32:.1f} | "
                             f"{t_x2:.1f} | {t_x2 / t_f32:.3f} | {errs[0][0]:.1e} / "
                             f"{errs[0][1]:.1e} | {errs[1][0]:.1e} / {errs[1][1]:.1e} |")
                print(lines[-1], flush=True)
            del sets
    text = header("The GELU epilogue's tanh, packed two to a MUFU op")
    text += (f"nn.Linear layout with a bias, cold L2, CUDA graph replay, {args.rounds} interleaved "
             "rounds (median). f32: tanh.approx.f32 per element (shipped); x2: tanh.approx.bf16x2 "
             "per pair. Error: relative Frobenius / max abs over max |ref|, against fp32 torch "
             "(gelu, tanh form) on the first 1024 rows.\n\n")
    text += ("| dtype | t(x2) / t(f32): geomean | min | max | GELU cost over bias alone: f32 | "
             "x2 |\n|---|---|---|---|---|---|\n")
    for dt, v in ratios.items():
        text += (f"| {dt} | {gmean(v):.3f} | {min(v):.3f} | {max(v):.3f} | "
                 f"{gmean(costs[(dt, 'f32')]):.3f} | {gmean(costs[(dt, 'x2')]):.3f} |\n")
    text += ("\n| dtype | MxNxK | schedule | bias µs | gelu f32 µs | gelu x2 µs | x2 / f32 | "
             "error f32 | error x2 |\n|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    path = write("gelu_pack_ab.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
