"""Two options of one problem, timed under tune's harness and under bench_epilogue's.

The table's rows come from ``cutlass-aot tune``: CUDA graph replay, cold L2
(``tune.timing``). bench_epilogue.py times eager calls on one operand set.
When a row's pick loses to another option in bench_epilogue while tune ranked
it first, either harness may be right for its own setting. This script times
both options of each pair both ways, interleaved (``--rounds`` rounds, in
reverse order every other round), on the same operands, so the two rankings
come from one run:

* graph: ``tune.timing.interleaved(graph=True)`` over cold operand sets;
* eager: ``_common.seconds`` (back-to-back eager launches, one operand set,
  the bench's ``iters``) per round, each ratio the median over rounds.

A pair is ``dtype:epilogue:MxNxK:A:B`` with epilogue ``plain``, ``bias`` or
``gelu`` (bias + GELU) and A, B option labels as the table writes them
(``128x256/2x1/m1``, ``128x256/2x1/m1/splitkx3``, ``.../streamk``).

A kernel change compares two builds instead: ``--b-cache DIR`` launches B's
option from the cache DIR (built from the new sources) and A's from
``--cache-dir``; a B of ``=`` names A's option, so B / A is the change's own
effect on that option (r44: GELU's packed tanh).

    python3 benchmarks/harness_ab.py --pairs PAIR,PAIR... [--rounds 5] [--b-cache DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import torch
from _common import gmean, header, linear_candidates, seconds, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import launch_choice
from cutlass_aot.tune.timing import TORCH_DTYPES, cold_operands, interleaved, round_order


def parse_pair(text: str) -> tuple:
    """``dtype:epilogue:MxNxK:A:B`` -> (dtype, epilogue, (m, n, k), A, B)."""
    parts = text.split(":")
    if len(parts) != 5 or parts[0] not in TORCH_DTYPES or parts[1] not in ("plain", "bias", "gelu"):
        raise ValueError(f"bad pair {text!r}: want dtype:plain|bias|gelu:MxNxK:A:B")
    try:
        m, n, k = (int(x) for x in parts[2].split("x"))
    except ValueError:
        raise ValueError(f"bad shape in {text!r}: want MxNxK") from None
    return parts[0], parts[1], (m, n, k), parts[3], parts[4]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--pairs", required=True, help="comma-separated dtype:epilogue:MxNxK:A:B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--b-cache", default=None,
                    help="launch B's option from this cache (a second build; module docstring)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        pairs = [parse_pair(p) for p in args.pairs.split(",") if p]
    except ValueError as exc:
        ap.error(str(exc))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    cache = cutlass_aot.open_cache(args.cache_dir)
    b_cache = cutlass_aot.open_cache(args.b_cache) if args.b_cache else cache
    lines, ratios = [], {"graph": [], "eager": []}
    for dname, epi, (m, n, k), la, lb in pairs:
        bias = None if epi == "plain" else dname
        lb = la if lb == "=" else lb
        opts, caches = [], (cache, b_cache)
        for lab, where in zip((la, lb), caches):
            sms, cands = linear_candidates(where, dname, bias=bias,
                                           act="gelu" if epi == "gelu" else "none")
            by_label = {ch.label(): ch for _, ch in select.ranked_choices(cands, m, n, k, 1, sms)}
            if lab not in by_label:
                raise SystemExit(f"harness_ab.py: no option {lab} at {m}x{n}x{k} in the cache "
                                 f"{where.path}")
            opts.append(by_label[lab])
        layout = (dname, dname, dname, "k", "k", "n", 2)
        sets = cold_operands(layout, m, n, k, 1)
        vecs = [None if bias is None else torch.randn(n, device="cuda").to(TORCH_DTYPES[dname])
                for _ in sets]
        graph_fns = [[functools.partial(launch_choice(where, ch, sms, m, n, 1, v, k=k), *ops)
                      for ops, v in zip(sets, vecs)] for ch, where in zip(opts, caches)]
        eager_fns = [graph_fns[0][0], graph_fns[1][0]]  # one operand set, as bench_epilogue
        iters = max(3, min(200, int(2e12 / (2.0 * m * n * k))))
        g = interleaved(graph_fns, rounds=args.rounds, graph=True)
        per = [[], []]
        for r in range(args.rounds):
            for i in round_order(2, r):
                per[i].append(seconds(eager_fns[i], iters) * 1e6)
        e = [statistics.median(x) for x in per]
        rg, re_ = g[1] / g[0], e[1] / e[0]
        ratios["graph"].append(rg)
        ratios["eager"].append(re_)
        lines.append(f"| {dname} | {epi} | {m}x{n}x{k} | {la} | {lb} | {g[0]:.1f} | {g[1]:.1f} | "
                     f"{rg:.3f} | {e[0]:.1f} | {e[1]:.1f} | {re_:.3f} |")
        print(lines[-1], flush=True)

    text = header("Two options per problem under tune's harness (graph, cold L2) and bench_epilogue's (eager)")
    text += (f"Each pair's A and B timed interleaved over {args.rounds} rounds, in reverse order every "
             "other round. graph: CUDA graph replay of back-to-back calls rotating cold operand sets "
             "(tune.timing); eager: back-to-back eager launches on one operand set (bench_epilogue's "
             "`seconds`). B / A > 1: A is faster.\n\n")
    if args.b_cache:
        text += (f"A from the cache {args.cache_dir or 'the default cache'}, B from {args.b_cache} "
                 "(two builds; B = A's option where the pair says `=`).\n\n")
    text += (f"- B / A, geomean over {len(lines)} pairs: graph {gmean(ratios['graph']):.3f}, "
             f"eager {gmean(ratios['eager']):.3f}\n\n")
    text += ("| dtype | epilogue | MxNxK | A | B | A µs (graph) | B µs (graph) | B / A (graph) | "
             "A µs (eager) | B µs (eager) | B / A (eager) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    print(text)
    print("wrote", write("harness_ab.md", text, args.out))


if __name__ == "__main__":
    main()
