"""Which residual (with-C) picks does a catalog or table change move? Replayed on the CPU.

Before spending device time on a change to the with-C catalog, this replays
dispatch's choice (``select.choose``: the GPU's table rows, the row-above
rule where dispatch applies it, then the model) for the residual nn.Linear
signature on two builds, ``--old-cache`` and ``--cache-dir``, over two
seeded samples: ``with_c_edge.py``'s held-out token counts at the tuned
residual widths (``--sample``, ``--seed``), where table rows serve most calls,
and ``bench_selection.sample``'s random shapes over every width
(``--random``, ``--seed``, ``--max-gflop``), where the model serves every
call. Per sample and token band it reports how many picks move, how many of
the moved picks are now the plain call's pick at that shape (what a twin of
a plain pick is for), and the forms they move to. No GPU: the rows bind to
each cache's entries by their kernel sources, as on the device.

``--raws FILE...`` adds the shapes of recorded ``bench_selection.py`` sweeps
(every option timed, plain calls) as a third sample and, for each moved pick
whose old and new forms the sweep timed, the plain-time ratio new / old: a
proxy for the with-C ratio (C's loads cost a tile 2-13% more, r66), from
timings already on disk, to say where a GPU run should look first.

r67 added six with-C forms a dtype that moved no pick at the tuned widths
and 48% of the model's picks on the random sample (2,000 shapes, bf16), 9% of those to the
plain call's pick; unmeasured, the change was taken back out.

    python3 benchmarks/with_c_replay.py --old-cache DIR [--cache-dir DIR]
        [--table configs/sm90-h100.selection.json] [--dtype bf16] [--sample 32] [--random 2000]
        [--seed S] [--max-gflop G] [--raws RAW...] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os

from _common import gmean, header, load_raw, write
from twin_coverage import BANDS, band_of, linear_dispatch
from with_c_edge import held_out_sample, random_sample, tuned_residuals

import cutlass_aot
from cutlass_aot.errors import KernelNotFoundError


def resolver(cache_dir: str, dtype: str, gpu: dict, with_c: bool):
    """dispatch's choice for the nn.Linear call in ``dtype`` (with C or not) on
    ``cache_dir``'s entries and its table for ``gpu`` (twin_coverage.linear_dispatch):
    (M, N, K) -> the option's label (``Choice.label``: form and split count, as the
    sweeps record options)."""
    try:
        choose = linear_dispatch(cutlass_aot.open_cache(cache_dir), dtype, gpu, with_c)[2]
    except KernelNotFoundError as exc:
        raise SystemExit(f"with_c_replay.py: {cache_dir} cannot serve the {dtype} nn.Linear call"
                         f"{' with C' if with_c else ''}: {str(exc).splitlines()[0]}") from None
    return lambda m, n, k: choose(m, n, k).label()


def replay(shapes, old, new, plain) -> tuple[str, int]:
    """The sample's table rows (per band) and how many picks moved."""
    total, moved, to_plain = collections.Counter(), collections.Counter(), collections.Counter()
    forms: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for m, n, k in shapes:
        band = band_of(m)
        total[band] += 1
        a, b = old(m, n, k), new(m, n, k)
        if a != b:
            moved[band] += 1
            to_plain[band] += b == plain(m, n, k)
            forms[band][b] += 1
    text = ""
    for lo, _ in BANDS:
        band = band_of(lo)
        if total[band]:
            top = ", ".join(f"{f} ({c})" for f, c in forms[band].most_common(4))
            text += (f"| {band} | {total[band]} | {moved[band]} ({moved[band] / total[band]:.0%}) | "
                     f"{to_plain[band]} | {top or '-'} |\n")
    return text, sum(moved.values())


def load_sweeps(paths) -> dict:
    """{(M, N, K): {option label: µs}} of recorded bench_selection.py sweeps
    (``--raw`` files, .xz or not; the first file to time a shape wins)."""
    out: dict = {}
    for path in paths:
        for r in load_raw(str(path)):
            out.setdefault((r["m"], r["n"], r["k"]), {o[0]: o[3] for o in r["options"]})
    return out


def proxy(sweeps: dict, old, new) -> tuple[str, int, int]:
    """Per token band, the plain-time ratio new / old of the moved picks the
    sweeps timed both forms of: (table rows, moved, matched)."""
    ratios: dict[str, list] = collections.defaultdict(list)
    moved = 0
    for (m, n, k), times in sweeps.items():
        a, b = old(m, n, k), new(m, n, k)
        if a == b:
            continue
        moved += 1
        if a in times and b in times:
            ratios[band_of(m)].append(times[b] / times[a])
    text = ""
    for lo, _ in BANDS:
        rs = ratios.get(band_of(lo))
        if rs:
            text += f"| {band_of(lo)} | {len(rs)} | {gmean(rs):.3f} | {min(rs):.2f} | {max(rs):.2f} |\n"
    return text, moved, sum(map(len, ratios.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR", ".devcache"))
    ap.add_argument("--old-cache", required=True, help="the build before the change")
    ap.add_argument("--table", default="configs/sm90-h100.selection.json",
                    help="whose GPU the tables' rows bind for (name, SM count, capability)")
    ap.add_argument("--manifest", default="configs/sm90.yaml", help="whose residual tune: --sample avoids")
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--sample", type=int, default=32)
    ap.add_argument("--random", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=67)
    ap.add_argument("--max-gflop", type=float, default=200.0)
    ap.add_argument("--raws", nargs="*", default=[],
                    help="recorded bench_selection.py sweeps: their shapes, and plain-time ratios")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.sample < 0 or args.random < 0 or not args.sample + args.random + len(args.raws):
        ap.error("--sample and --random must be 0 or more, and not both 0")
    if not args.max_gflop > 0:
        ap.error("--max-gflop must be above 0")
    gpu = json.loads(open(args.table).read())["gpu"]
    old = resolver(args.old_cache, args.dtype, gpu, True)
    new = resolver(args.cache_dir, args.dtype, gpu, True)
    plain = resolver(args.cache_dir, args.dtype, gpu, False)
    text = header(f"Residual picks moved between two builds ({args.dtype}, {gpu['name']} table, CPU replay)")
    text += (f"old {args.old_cache}, new {args.cache_dir}; dispatch's choice for the with-C nn.Linear call "
             "(table rows, the row above, the model). 'to the plain pick': the moved pick is the form and "
             "split count the plain call picks at that shape on the new build.\n\n")
    samples = []
    if args.sample:
        samples.append((f"{args.sample} held-out token counts at the tuned residual widths (seed {args.seed})",
                        held_out_sample(tuned_residuals(args.manifest, args.dtype), args.sample, args.seed, 16384)))
    if args.random:
        samples.append((f"{args.random} random shapes, every width (bench_selection.sample, seed {args.seed}, "
                        f"at most {args.max_gflop:g} GFLOP)", random_sample(args.random, args.seed, args.max_gflop)))
    for title, shapes in samples:
        rows, moved = replay(shapes, old, new, plain)
        text += (f"## {title}: {moved} of {len(shapes)} picks moved\n\n"
                 "| tokens | problems | picks moved | to the plain pick | moved to (count) |\n|---|---|---|---|---|\n"
                 + rows + "\n")
    if args.raws:
        rows, moved, matched = proxy(load_sweeps(args.raws), old, new)
        text += (f"## The recorded sweeps' shapes ({', '.join(os.path.basename(p) for p in args.raws)}): "
                 f"{moved} picks moved, {matched} with both forms timed\n\n"
                 "Plain-call times of the moved pick's form over the old pick's, from the sweeps (a proxy "
                 "for the with-C ratio; > 1: the new pick's form ran slower plain).\n\n"
                 "| tokens | moved, both timed | new / old, geomean | best | worst |\n|---|---|---|---|---|\n"
                 + (rows or "| - | 0 | - | - | - |\n") + "\n")
    print(text)
    print("wrote", write(f"with_c_replay_{args.dtype}.md", text, args.out))


if __name__ == "__main__":
    main()
