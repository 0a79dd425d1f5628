"""Does the with-C catalog hold the forms the plain call picks? Replayed on the CPU.

A residual call (D = A·B + C) can only run a with-C variant. Where the plain
nn.Linear call of the same shape would pick a form (tile, cluster, walk,
swap, split-K or not) that no with-C variant has, the residual call runs
something else, and r65 found those shapes 0.70-0.82 of cuBLAS's addmm.
This script runs dispatch's choice (``select.choose``: the GPU's table, then
the model) for the plain signature and for its with-C twin at token counts
log-spaced over 1..``--max-m`` at each residual width of the manifest's
``tune:`` section, and reports, per token band, how often the plain pick's
form is missing from the with-C catalog, which forms those are, and how
often the two calls pick different forms at all. No GPU: the table binds to
the cache's entries by their kernel sources, as it does on the device.

    python3 benchmarks/twin_coverage.py [--cache-dir .devcache] [--table configs/sm90-h100.selection.json]
        [--dtype bf16] [--points 401] [--max-m 16384] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os

from _common import header, write
from with_c_edge import tuned_problems

import cutlass_aot
from cutlass_aot.errors import KernelNotFoundError
from cutlass_aot.run import select
from cutlass_aot.signature import gemm_signature

BANDS = ((1, 64), (65, 512), (513, 4096), (4097, 1 << 30))


def band_of(m: int) -> str:
    lo, hi = next((lo, hi) for lo, hi in BANDS if lo <= m <= hi)
    return f"{lo}..{hi}" if hi < 1 << 30 else f"{lo}.."


def linear_dispatch(cache, dtype: str, gpu: dict, with_c: bool):
    """The nn.Linear call in ``dtype`` (with a C of D's dtype or without) on
    ``cache`` and its table rows for ``gpu`` (name, sm_count, capability):
    (candidates, rows, choose), where ``choose(m, n, k)`` is dispatch's
    ``select.choose`` for it, rule 3 where ``select.row_above_serves`` lets it
    take part. Raises KernelNotFoundError where the cache cannot serve it."""
    sig = gemm_signature("sm_90a", a=dtype, b=dtype, d=dtype, c=dtype if with_c else None,
                         a_major="k", b_major="k", d_major="n", rank=2)
    cands = cache.gemm.runner._candidates_for(sig)
    rows = cache.table_rows(sig, gpu["name"], gpu["sm_count"], gpu["capability"])
    above = select.row_above_serves(dict(sig.fields))

    def choose(m: int, n: int, k: int) -> select.Choice:
        return select.choose(cands, m, n, k, 1, gpu["sm_count"], rows, above=above)

    return cands, rows, choose


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR", ".devcache"))
    ap.add_argument("--table", default="configs/sm90-h100.selection.json",
                    help="whose GPU the table's rows bind for (name, SM count, capability)")
    ap.add_argument("--manifest", default="configs/sm90.yaml")
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--points", type=int, default=401)
    ap.add_argument("--max-m", type=int, default=16384)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gpu = json.loads(open(args.table).read())["gpu"]
    cache = cutlass_aot.open_cache(args.cache_dir)
    dn = args.dtype
    try:
        calls = {c: linear_dispatch(cache, dn, gpu, c) for c in (False, True)}
    except KernelNotFoundError as exc:
        raise SystemExit(f"twin_coverage.py: {args.cache_dir} cannot serve both calls in {dn}: "
                         f"{str(exc).splitlines()[0]}") from None
    (plain_cands, plain_rows, plain_choose), (c_cands, c_rows, c_choose) = calls[False], calls[True]
    with_c_forms = {c.label() for c in c_cands}
    widths = sorted({(n, k) for _, n, k in tuned_problems(args.manifest, dn, True)})
    ms = sorted({max(1, round(args.max_m ** (i / (args.points - 1)))) for i in range(args.points)})
    total, missing, differ = collections.Counter(), collections.Counter(), collections.Counter()
    absent: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for n, k in widths:
        for m in ms:
            band = band_of(m)
            plain, with_c = plain_choose(m, n, k), c_choose(m, n, k)
            total[band] += 1
            if plain.candidate.label() not in with_c_forms:
                missing[band] += 1
                absent[band][plain.candidate.label()] += 1
            if (plain.candidate.label(), plain.splits) != (with_c.candidate.label(), with_c.splits):
                differ[band] += 1
    text = header(f"With-C twins of the plain picks ({dn}, {gpu['name']} table, CPU replay)")
    text += (f"cache {args.cache_dir}: {len(plain_cands)} plain nn.Linear candidates, {len(c_cands)} with C "
             f"({len(plain_rows or {})} and {len(c_rows or {})} table rows bound); widths (N, K) "
             f"{', '.join(f'{n}x{k}' for n, k in widths)} (the manifest's residual tune groups); "
             f"{len(ms)} token counts log-spaced over 1..{args.max_m} at each.\n\n"
             "| tokens | problems | plain pick's form has no with-C twin | picks differ | forms missing (count) |\n"
             "|---|---|---|---|---|\n")
    for lo, _ in BANDS:
        band = band_of(lo)
        if not total[band]:
            continue
        top = ", ".join(f"{f} ({c})" for f, c in absent[band].most_common(6))
        text += (f"| {band} | {total[band]} | {missing[band]} ({missing[band] / total[band]:.0%}) | "
                 f"{differ[band]} ({differ[band] / total[band]:.0%}) | {top or '-'} |\n")
    print(text)
    print("wrote", write(f"twin_coverage_{dn}.md", text, args.out))


if __name__ == "__main__":
    main()
