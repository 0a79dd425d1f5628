"""Co-resident decode CTAs, the late PDL trigger and the L2 prefetch: one schedule, its forms.

Three sm90_gemm parameters aim at the fixed cost of a decode call (its ramp
and drain, about 2.6 µs on the H200, r35): ``ctas_per_sm`` 2 halves the ring
and caps the registers so the next grid's CTAs can be resident while this
grid streams; ``pdl_trigger: loads`` lets the next grid launch only once the
producer has issued its last load (so its set-up and prefetch land in this
grid's drain, not its middle); ``prefetch`` asks the L2 for the first
k-blocks before the programmatic-launch wait. For every schedule the cache
builds in more than one form, this times the forms together on each problem,
interleaved (tune.timing.interleaved: CUDA graph replay, cold
L2, rounds in alternating order), in two settings:

* back to back: the graph holds only our calls, so each kernel's prefetch
  runs while the one ahead of it drains (a GEMM after a GEMM);
* spaced: a one-element torch kernel after every call (a kernel that does
  not trigger its dependents early, as most of torch's), so the prefetch
  can only start once that kernel has ended.

Ratios are t(form) / t(base form: prefetch 0, one CTA an SM, trigger at
start): below 1 the form is faster. cuBLAS
(torch.mm) is timed in the same rounds for scale. Default problems: the
decode grid's (N, K) at a few token counts, and two large problems where
a prefetch has little to hide.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch
from _common import gmean, header, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import cold_operands, interleaved, rotate

DEFAULT_SHAPES = ("1x4096x4096,8x4096x4096,16x4096x4096,1x6144x4096,16x6144x4096,"
                  "1x4096x14336,1x8192x8192,16x8192x8192,1x28672x4096")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        try:
            m, n, k = (int(x) for x in item.strip().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is not MxNxK (e.g. 1x4096x4096)") from None
        out.append((m, n, k))
    return out


BASE = (0, 1, "start")


def form(c: select.Candidate) -> tuple:
    """(prefetch, ctas_per_sm, pdl_trigger) of a candidate."""
    ex = dict(c.extra)
    return (c.prefetch, int(ex.get("ctas_per_sm", 1)), str(ex.get("pdl_trigger", "start")))


def form_label(f: tuple) -> str:
    return f"pf{f[0]}/c{f[1]}/{f[2]}"


def groups(cands: list[select.Candidate]) -> dict[tuple, dict[tuple, select.Candidate]]:
    """Schedules built in the base form and others: {schedule less the forms: {form: cand}}."""
    by = defaultdict(dict)
    for c in cands:
        rest = tuple(kv for kv in c.extra if kv[0] not in ("ctas_per_sm", "pdl_trigger"))
        by[c.schedule[:-1] + (c.gemv, rest)][form(c)] = c
    return {k: v for k, v in by.items() if len(v) > 1 and BASE in v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache = cutlass_aot.open_cache(args.cache_dir)
    arch, sms, _, _ = device_info(0)
    sig = gemm_signature(arch, a=args.dtype, b=args.dtype, d=args.dtype, c=None, a_major="k",
                         b_major="k", d_major="n", rank=2)
    cands = cache.gemm.runner._candidates_for(sig)
    grouped = groups(cands)
    if not grouped:
        sys.exit(f"{args.cache_dir}: no schedule of {sig.text} is built in two forms")
    spacer = torch.zeros(1, device="cuda")

    def spaced(fns):
        def wrap(f):
            def g(*xs):
                f(*xs)
                spacer.add_(1.0)
            return g
        return [wrap(f) for f in fns]

    lines, ratios = [], defaultdict(list)
    for m, n, k in parse_shapes(args.shapes):
        sets = cold_operands((args.dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        ref = rotate(lambda a, b, out: torch.mm(a, b, out=out), sets)
        for sched, by_depth in sorted(grouped.items(), key=lambda kv: str(kv[0])):
            depths = [BASE] + sorted(f for f in by_depth if f != BASE)
            base = by_depth[BASE]
            decode_form = base.swap_ab or base.k_cluster > 1 or base.tile_n < 128
            if decode_form != (m <= 256):
                continue  # decode schedules on decode problems, wide tiles on large ones
            splits = select.split_choices(base, m, n, k, 1, sms)[0]
            launchers = [launch_choice(cache, select.Choice(by_depth[d], splits, "bench"), sms,
                                       m, n, 1, k=k) for d in depths]
            fns = [rotate(f, sets) for f in launchers]
            back = interleaved([ref, *fns], rounds=args.rounds, graph=True)
            spc = interleaved([spaced(ref), *(spaced(f) for f in fns)], rounds=args.rounds,
                              graph=True)
            label = select.Choice(base, splits, "bench").label()
            # Same math, same order: every depth must give the base's bits.
            a, b, _ = sets[0]
            outs = []
            for f in launchers:
                o = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
                f(a, b, o)
                outs.append(o)
            for d, o in zip(depths[1:], outs[1:]):
                if not torch.equal(o, outs[0]):
                    sys.exit(f"{m}x{n}x{k} {label}: {form_label(d)} gives other bits than the base")
            for i, d in enumerate(depths[1:], start=1):
                rb, rs = back[i + 1] / back[1], spc[i + 1] / spc[1]
                ratios[(d, "back")].append(rb)
                ratios[(d, "spaced")].append(rs)
                lines.append(f"| {m}x{n}x{k} | {label} | {form_label(d)} | {back[0]:.1f} | {back[1]:.1f} | "
                             f"{back[i + 1]:.1f} | {rb:.3f} | {spc[1]:.1f} | {spc[i + 1]:.1f} | "
                             f"{rs:.3f} |")
                print(lines[-1], flush=True)
        del sets
    text = header("Decode forms: co-resident CTAs, late PDL trigger, L2 prefetch")
    text += (f"{args.dtype}, nn.Linear layout, cold L2 (operand sets rotated), CUDA graph replay, "
             f"{args.rounds} interleaved rounds (median). 'back to back': our calls only; "
             "'spaced': a one-element torch kernel after every call. Ratio = t(form) / "
             "t(base form) of the same schedule and split: below 1 the form is faster. Forms are "
             "pf<prefetch k-blocks>/c<CTAs an SM>/<PDL trigger>; the base is "
             f"{form_label(BASE)}.\n\n")
    text += "| form | setting | pairs | geomean | min | max |\n|---|---|---|---|---|---|\n"
    for (d, how), v in sorted(ratios.items()):
        text += (f"| {form_label(d)} | {how} | {len(v)} | {gmean(v):.3f} | {min(v):.3f} | "
                 f"{max(v):.3f} |\n")
    text += ("\n| MxNxK | schedule | form | cuBLAS µs | base µs | form µs | ratio | "
             "base µs (spaced) | form µs (spaced) | ratio (spaced) |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    path = write(f"coresident_ab_{args.dtype}.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
