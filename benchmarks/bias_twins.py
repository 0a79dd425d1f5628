"""Which plain nn.Linear forms the bias catalog lacks, by the model's own picks (no GPU)

A call with a bias (and GELU) chooses only among the bias variants. Where the
plain call's pick has no bias twin, the bias call runs a form the model ranks
slower. This script measures that gap by the model's estimates, on seeded
random shapes drawn like bench_epilogue's held-out sample (M 256..16384, N and
K 1024..28672 in steps of 64, at most 2 TFLOP) but from other seeds, so
the benchmark's own shapes never choose the catalog:

- ``--fit SEED``: the plain forms that, added to the bias catalog one at a
  time (greedily, most gain first), lower the geomean of (best bias
  estimate / best plain estimate) the most;
- ``--check SEED``: the same figure on another seed, before and after adding
  the chosen forms.

It reads a built cache (``--cache-dir``): its bias catalog is what "before"
means. Estimates are the model's (run/select.py), not timings; the GPU
benchmark (bench_epilogue.py --sample heldout) says what the forms are worth.
"""

from __future__ import annotations

import argparse
import math
import sys

from _common import header, linear_candidates, write
from bench_epilogue import heldout_sample


def estimates(cache, dtype: str, shapes, sms: int):
    """(rows, have, labels): per shape a row (best plain estimate, {plain schedule: its
    best estimate}); the schedules the bias catalog offers (read from the bias+GELU
    signature: the manifest builds every bias form with and without GELU); each plain
    schedule's label."""
    from cutlass_aot.run import select  # noqa: PLC0415

    _, plain = linear_candidates(cache, dtype, sms)
    _, biased = linear_candidates(cache, dtype, sms, bias=dtype, act="gelu")
    have = {c.schedule for c in biased}
    labels = {c.schedule: c.label() for c in plain}
    rows = []
    for m, n, k in shapes:
        best: dict[tuple, float] = {}
        for us, choice in select.ranked_choices(plain, m, n, k, 1, sms):
            best.setdefault(choice.candidate.schedule, us)
        rows.append((min(best.values()), best))
    return rows, have, labels


def gap(rows, have: set, added: list) -> float:
    """Geomean over shapes of best bias-catalog estimate over best plain estimate."""
    logs = []
    for plain_us, best in rows:
        offered = [us for s, us in best.items() if s in have or s in added]
        logs.append(math.log(min(offered) / plain_us) if offered else float("nan"))
    return math.exp(sum(logs) / len(logs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--fit", type=int, default=5005, help="seed the forms are chosen on")
    ap.add_argument("--check", type=int, nargs="*", default=[6006], help="seeds to check them on")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--forms", type=int, default=10, help="forms to choose")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cutlass_aot  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    rows, have, labels = estimates(cache, args.dtype, heldout_sample(args.count, args.fit), args.sms)
    text = header("Bias-catalog forms chosen by the model's plain picks (estimates, no GPU)")
    text += (__doc__.split("\n\n")[1].replace("\n", " ") + "\n\n"
             f"{args.dtype}, {args.count} shapes a seed, {args.sms} SMs; cache {args.cache_dir} "
             f"({len(have)} bias+GELU schedules).\n\n"
             f"## Greedy choice on seed {args.fit}\n\n| step | form added | bias / plain (geomean) |\n"
             f"|---|---|---|\n| 0 | (the cache's bias catalog) | {gap(rows, have, []):.4f} |\n")
    added: list = []
    pool = set().union(*(best.keys() for _, best in rows)) - have
    for step in range(1, args.forms + 1):
        if not pool - set(added):
            break
        pick = min(pool - set(added), key=lambda s: gap(rows, have, added + [s]))
        added.append(pick)
        text += f"| {step} | {labels[pick]} | {gap(rows, have, added):.4f} |\n"
    text += "\n## Check seeds\n\n| seed | before | with the forms |\n|---|---|---|\n"
    for seed in args.check:
        crow, chave, _ = estimates(cache, args.dtype, heldout_sample(args.count, seed), args.sms)
        text += f"| {seed} | {gap(crow, chave, []):.4f} | {gap(crow, chave, added):.4f} |\n"
    path = write(f"bias_twins_{args.dtype}.md", text, args.out)
    sys.stdout.write(text + f"\nwrote {path}\n")


if __name__ == "__main__":
    main()
