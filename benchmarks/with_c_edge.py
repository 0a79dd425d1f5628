"""The cost of r62's bounds-checked C loads: with-C GEMMs from two builds, interleaved.

r62 (8d8cbe4) moved the with-C epilogue's load of C inside the edge tile's
bounds check: before, an edge tile loaded C at every coordinate of the tile,
past the tensor, then dropped what lay outside. The fix loads one predicated
element at a time in edge tiles (interior tiles are unchanged), so its cost
shows on problems whose M or N is not a multiple of the tile, and not at all
on aligned ones (the control rows). Rows are classed decode (M <= 128),
edge or aligned (``shape_class``), and the summary is per class.

For each shape it times ``cache.gemm(a, b, out, c=c, beta=0.5)`` from the
fixed cache (``--cache-dir``) and from the pre-fix build (``--old-cache``),
with ``torch.addmm(c, a, b, beta=0.5)`` as the reference, under CUDA graph
replay over cold operand sets (``tune.timing.interleaved``), in reverse order
every other round. It checks the fixed build's result against an fp32
reference on a poisoned ``out`` first: max |out - ref| / (|ref| + 1) under
2e-2, or, past that (r68 saw 0.0204 at K = 45888; accuracy_probe.py asks
why), at most twice cuBLAS's own error on the same operands.

C is a view of the first M rows of a buffer with 257 more: the pre-fix
build reads up to a tile past C, and where that lands past an allocation it
faults (r63's first run of this script: an illegal memory access at
129x4104x4096, the pre-fix build, with torch's caching allocator on). The
slack keeps those reads inside memory, so both builds time the traffic they
really issue.

Any two builds compare the same way: ``--about`` says in the report what
"old" and "new" are (r63: the residual twins, new = with them; r64: the
same build, new with residual rows tuned into its table).

``--sample N`` replaces the shapes with a seeded sample held out from a
tune: at each (N, K) width of the manifest's residual ``tune:`` problems
(``with_c: true``, in ``--dtype``), token counts log-uniform over
1..``--max-m``, none of them a problem the manifest tunes. A table row
serves its exact problem; these read what the rows do for the token counts
a service meets between them (``select.row_below``, else the model).

``--random N`` draws the shapes from ``bench_selection.sample`` instead
(seeded: M log-uniform over 1..65536, N and K multiples of 8 log-uniform
over 256..57344, the extremes first), at most ``--max-gflop`` each: widths
no residual row covers, where the model serves every residual call. r67
found that a change to the with-C catalog which moves no pick at the tuned
widths moved 48% of the model's picks on such a sample (with_c_replay.py), so a
catalog change is timed on both samples.

``--twin`` times a fourth option from the new cache: the with-C twin of the
plain call's pick (dispatch's choice for the same problem without C, launched
as its with-C variant through ``dispatch.launch_choice``, beta 1), where the
cache has one and it differs from the new pick. r67's replay found the model's
with-C picks at random widths leave the plain pick's form at 1..64 tokens in
every moved case; this column times whether following the plain pick (the
reason r66 built twins) would serve those calls better.

    python3 benchmarks/with_c_edge.py --old-cache DIR [--shapes MxNxK,...] [--dtype bf16]
        [--sample N --seed S --manifest configs/sm90.yaml --max-m M]
        [--random N --seed S --max-gflop G] [--twin] [--about TEXT] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
from pathlib import Path

import torch
from _common import gmean, header, max_rel_err, write

import cutlass_aot
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.tune.timing import TORCH_DTYPES, copies_for, interleaved, l2_bytes

# Edge shapes for the with-C tiles (128x256 and 128x128), then aligned controls.
DEFAULT_SHAPES = ("4000x4104x4096,1000x3000x4096,8191x1544x2048,2047x6152x1024,129x4104x4096,"
                  "3001x12296x2048,4096x4096x4096,2048x8192x1024")


def shapes_arg(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        try:
            m, n, k = (int(x) for x in part.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}: want MxNxK") from None
        if min(m, n, k) < 1 or n % 8 or k % 8:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}: M, N, K >= 1 and N, K multiples of 8")
        out.append((m, n, k))
    return out


def tuned_problems(manifest: str, dtype: str, with_c: bool) -> set[tuple[int, int, int]]:
    """(M, N, K) of the manifest's ``tune:`` problems of the nn.Linear call in
    ``dtype`` (rank 2, no bias, no activation), with a C of D's dtype or
    without one. A shape file reads a manifest's ``tune:`` section as it
    would its own list."""
    from cutlass_aot.tune.shapes import load_shape_file  # noqa: PLC0415 - only for --sample

    return {(p.m, p.n, p.k) for p in load_shape_file(manifest)
            if p.c == (dtype if with_c else None) and p.layout == (dtype, dtype, dtype, "k", "k", "n", 2)
            and p.bias is None and p.act == "none" and p.l == 1}


def tuned_residuals(manifest: str, dtype: str) -> set[tuple[int, int, int]]:
    """(M, N, K) of the manifest's ``tune:`` problems with a C in ``dtype``:
    this script's calls."""
    return tuned_problems(manifest, dtype, True)


def held_out_sample(tuned: set, count: int, seed: int, max_m: int) -> list[tuple[int, int, int]]:
    """``count`` shapes at the tuned problems' (N, K) widths, in turn, with M
    log-uniform over 1..max_m and never a tuned problem (module docstring)."""
    widths = sorted({(n, k) for _, n, k in tuned})
    if not widths:
        raise SystemExit("with_c_edge.py: --sample: the manifest tunes no residual problem in "
                         "this dtype (a tune: group with with_c: true)")
    rng, out = random.Random(seed), []
    while len(out) < count:
        n, k = widths[len(out) % len(widths)]
        m = round(math.exp(rng.uniform(0.0, math.log(max_m))))
        if (m, n, k) not in tuned and (m, n, k) not in out:
            out.append((m, n, k))
    return out


def random_sample(count: int, seed: int, max_gflop: float) -> list[tuple[int, int, int]]:
    """``count`` shapes of bench_selection.py's seeded random sample (its
    held-out sample's law, any widths), at most ``max_gflop`` each."""
    from bench_selection import sample  # noqa: PLC0415 - one sampler for both benchmarks

    return sample(seed, count, max_gflop)


def shape_class(m: int, n: int) -> str:
    """``decode`` (M <= 128: a few tokens, whatever the tiles), ``edge`` (M or
    N off the 128 grid: edge tiles), else ``aligned`` (the controls)."""
    if m <= 128:
        return "decode"
    return "edge" if m % 128 or n % 128 else "aligned"


def ours(cache, a, b, c, out) -> None:
    cache.gemm(a, b, out, c=c, beta=0.5)


def cublas(a, b, c, out) -> None:
    torch.addmm(c, a, b, beta=0.5, out=out)


def pick(cache, a, b, c, out) -> str:
    """What ``cache``'s dispatch resolved for these operands (after a call)."""
    ch = cache.gemm.runner.choice_for(a, b, out, c=c)
    return ch.label() if ch is not None else "?"


def twin_of_plain(plain_choose, c_cands, m: int, n: int, k: int):
    """The with-C twin of the plain nn.Linear call's pick at (m, n, k), as a
    ``select.Choice`` (module docstring, ``--twin``); None where ``c_cands``
    (the with-C candidates) hold no variant of that form. ``plain_choose`` is
    ``twin_coverage.linear_dispatch``'s choose for the plain call."""
    from cutlass_aot.run import select  # noqa: PLC0415 - only for --twin

    plain = plain_choose(m, n, k)
    twin = next((c for c in c_cands if c.label() == plain.candidate.label()), None)
    return None if twin is None else select.Choice(twin, plain.splits, "twin")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--old-cache", required=True, help="the pre-fix build's cache")
    ap.add_argument("--about", help="what the two builds are, for the report (default: the two cache "
                    "paths; r62's run compared 8d8cbe4's bounds-checked C loads, new, with 59adaf7's)")
    ap.add_argument("--shapes", type=shapes_arg, default=shapes_arg(DEFAULT_SHAPES))
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--sample", type=int, default=0, help="held-out shapes instead of --shapes")
    ap.add_argument("--seed", type=int, default=64)
    ap.add_argument("--manifest", default=str(Path(__file__).resolve().parents[1] / "configs"
                                              / "sm90.yaml"), help="whose tune: --sample avoids")
    ap.add_argument("--max-m", type=int, default=16384)
    ap.add_argument("--random", type=int, default=0,
                    help="N seeded random shapes over every width instead (module docstring)")
    ap.add_argument("--max-gflop", type=float, default=200.0,
                    help="--random redraws shapes of more GFLOP than this")
    ap.add_argument("--twin", action="store_true",
                    help="also time the with-C twin of the plain call's pick (module docstring)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.sample < 0 or args.max_m < 1:
        ap.error("--sample must be 0 or more and --max-m at least 1")
    if args.random < 0 or not args.max_gflop > 0:
        ap.error("--random must be 0 or more and --max-gflop above 0")
    if args.sample and args.random:
        ap.error("--sample and --random are two samples: pick one a run")
    if args.about is None:  # r63-r71 runs without --about printed r62's sentence here
        args.about = f"new: {args.cache_dir or 'the default cache'}; old: {args.old_cache}"
    if args.random:
        args.shapes = random_sample(args.random, args.seed, args.max_gflop)
        args.about += (f"; shapes: {args.random} seeded random (bench_selection.sample, seed "
                       f"{args.seed}, at most {args.max_gflop:g} GFLOP)")
    if args.sample:
        args.shapes = held_out_sample(tuned_residuals(args.manifest, args.dtype), args.sample,
                                      args.seed, args.max_m)
        args.about += (f"; shapes: {args.sample} held out from {Path(args.manifest).name}'s "
                       f"residual tune: problems, seed {args.seed}, M log-uniform 1..{args.max_m}")
    new, old = cutlass_aot.open_cache(args.cache_dir), cutlass_aot.open_cache(args.old_cache)
    _, sms, gpu_name, cc = device_info(0)
    gpu = {"name": gpu_name, "sm_count": sms, "capability": cc}
    if args.twin:
        from twin_coverage import linear_dispatch  # noqa: PLC0415 - only for --twin

        plain_choose = linear_dispatch(new, args.dtype, gpu, False)[2]
        c_cands = linear_dispatch(new, args.dtype, gpu, True)[0]
    dt = TORCH_DTYPES[args.dtype]
    lines, ratios, vs_cublas = [], [], {"new": [], "old": []}
    twin_ratios = []  # (class, twin / new) where the twin differs from the new pick
    twin_absent = twin_same = 0  # shapes whose plain pick has no with-C twin / is the new pick
    off = []  # shapes whose result failed the check: the run exits 1 after its report
    for m, n, k in args.shapes:
        count = copies_for(2 * (m * k + n * k + 2 * m * n), l2_bytes(0))
        sets = []
        for _ in range(count):
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(n, k, device="cuda", dtype=dt).t()
            c = torch.randn(m + 257, n, device="cuda", dtype=dt)[:m]  # slack: module docstring
            sets.append((a, b, c, torch.empty(m, n, device="cuda", dtype=dt)))
        a, b, c, out = sets[0]
        out.fill_(float("nan"))
        ours(new, a, b, c, out)
        labels = [pick(new, *sets[0])]
        ref = a.float() @ b.float() + 0.5 * c.float()
        err = max_rel_err(out, ref)
        if not err < 2e-2:
            # r68: 21x18832x45888 (bf16) read 0.0204 here, and shapes past K ~
            # 28672 read 0.013-0.018 on several forms. r71's accuracy_probe.py
            # run found it is accumulation over one long K (Frobenius error
            # equal to cuBLAS's, every option's error pulled toward zero,
            # less where split-K or K-cluster forms share K; cuBLAS itself read
            # 2.1e-2 at 66x25808x55080), and since then dispatch runs promoted
            # decode tiles from K 16384 on. A pick over 2e-2 must stay within twice
            # cuBLAS's own error on the same operands. NaN fails either way.
            cub = torch.full_like(out, float("nan"))
            cublas(a, b, c, cub)
            cub_err = max_rel_err(cub, ref)
            if not err <= 2 * cub_err:
                # Recorded, and the run goes on to time the other shapes, then
                # exits 1 after writing the report (r71: one shape at K 57112
                # had stopped a 200-shape run, and its timings were lost).
                off.append(f"{m}x{n}x{k} ({labels[0]}): max relative error {err:.3g}, cuBLAS's {cub_err:.3g}")
                print(f"with_c_edge.py: {m}x{n}x{k}: the new build's result is off ({off[-1]})", flush=True)
            else:
                print(f"{m}x{n}x{k}: max relative error {err:.3g} passes 2e-2; cuBLAS's is {cub_err:.3g}",
                      flush=True)
        ours(old, *sets[0])
        labels.append(pick(old, *sets[0]))

        fns = [[functools.partial(ours, new, *s) for s in sets],
               [functools.partial(ours, old, *s) for s in sets],
               [functools.partial(cublas, *s) for s in sets]]
        twin = twin_of_plain(plain_choose, c_cands, m, n, k) if args.twin else None
        twin_absent += args.twin and twin is None
        if twin is not None and twin.label() == labels[0]:
            twin, twin_same = None, twin_same + 1  # the new pick is the twin already: nothing to time
        if twin is not None:
            run_twin = launch_choice(new, twin, gpu["sm_count"], m, n, 1, k=k)
            # sets hold (a, b, c, out); launch_choice's closure takes (a, b, out, c), beta 1
            fns.append([functools.partial(run_twin, s[0], s[1], s[3], s[2]) for s in sets])
        times = interleaved(fns, rounds=args.rounds, graph=True)
        t_new, t_old, t_ref = times[:3]
        cls = shape_class(m, n)
        twin_cells = "| - | - | - "
        if twin is not None:
            twin_ratios.append((cls, times[3] / t_new))
            twin_cells = f"| {times[3]:.1f} | {times[3] / t_new:.3f} | {twin.label()} "
        ratios.append((cls, t_new / t_old))
        vs_cublas["new"].append(t_ref / t_new)
        vs_cublas["old"].append(t_ref / t_old)
        lines.append(f"| {m}x{n}x{k} | {cls} | {t_old:.1f} | {t_new:.1f} | "
                     f"{t_new / t_old:.3f} | {t_ref:.1f} | {t_ref / t_new:.3f} | {t_ref / t_old:.3f} | {err:.1e} | {labels[0]} | {labels[1]} "
                     + (twin_cells if args.twin else "") + "|")
        print(lines[-1], flush=True)
        del sets, a, b, c, out, fns
        torch.cuda.empty_cache()

    by_class = {c: [r for e, r in ratios if e == c] for c in ("decode", "edge", "aligned")}
    text = header(f"With-C GEMMs ({args.dtype}, D = A·B + 0.5·C) from two builds, and cuBLAS's addmm")
    text += (f"CUDA graph replay over cold operand sets, {args.rounds} rounds interleaved (new, old, "
             "cuBLAS `addmm`), in reverse order every other round; µs per call, median of rounds. "
             f"new / old > 1: new is slower. {args.about}.\n\n")
    text += ("- new / old, geomean: " + ", ".join(
        f"{c} {gmean(rs):.3f} ({len(rs)})" for c, rs in by_class.items() if rs) + "\n"
             f"- vs cuBLAS addmm, geomean: new {gmean(vs_cublas['new']):.3f}, old "
             f"{gmean(vs_cublas['old']):.3f}\n")
    if args.twin:
        twin_by = {c: [r for e, r in twin_ratios if e == c] for c in ("decode", "edge", "aligned")}
        text += ("- the plain pick's with-C twin (beta 1) / new, geomean over the shapes where it differs: "
                 + (", ".join(f"{c} {gmean(rs):.3f} ({len(rs)}, worst {max(rs):.3f}, best {min(rs):.3f})"
                              for c, rs in twin_by.items() if rs) or "none differs")
                 + f" (of the other shapes, {twin_same} picked the twin, {twin_absent} had none)\n")
    if off:
        text += (f"- **results off** (above 2e-2 and more than twice cuBLAS's error; NaN included), "
                 f"{len(off)}: " + "; ".join(off) + "\n")
    text += "\n"
    text += ("| MxNxK | class | old µs | new µs | new / old | cuBLAS µs | cuBLAS / new | cuBLAS / old "
             "| max rel err (new) | new pick | old pick "
             + ("| twin µs | twin / new | plain pick's twin " if args.twin else "") + "|\n"
             + "|---" * (14 if args.twin else 11) + "|\n")
    text += "\n".join(lines) + "\n"
    print(text)
    print("wrote", write("with_c_edge.md", text, args.out))
    if off:
        raise SystemExit(f"with_c_edge.py: {len(off)} result(s) off: " + "; ".join(off))


if __name__ == "__main__":
    main()
