"""Odd-edge outputs: what writing out through scratch costs (run/pitch.py odd_edge).

Run on a GPU machine with a cache built from configs/sm90.yaml:

    CUTLASS_AOT_CACHE_DIR=... python3 benchmarks/bench_odd_edge.py [--out FILE]

An ``out`` whose pointer and strides are 16-byte multiples but whose rows
end off a 16-byte boundary (a padded view: ``out_pad[:, :N]`` with N not a
multiple of 8 elements) takes the aligned signature, yet sm90_gemm's TMA
store would write past its edge. Dispatch serves it with the variant writing
16-byte pitched scratch and torch copying the view back (r47). Per shape,
nn.Linear layout x[M,K] @ w[N,K].t():

* cuBLAS: torch.mm into the same view;
* pick: cache.gemm into the view (the odd-edge route: kernel + copy back,
  marked ``+copy``; a family that stores each element under its own bounds
  check, such as the gemv at one token, writes the view in place);
* padded: cache.gemm into ``out_pad`` with w padded to N rounded up to 8
  rows (the same problem, 1-7 columns wider, no copy): pick - padded is
  what the copy costs.

Two shape sets: ``suite`` (LM heads with odd vocabularies and odd-width
projections at decode and prefill token counts) and ``heldout``, a seeded
random sample (seed 3005: M log-uniform over 1..16384, N over 96..57344 and
not a multiple of 8, K a multiple of 8 over 256..16384) no rule here was
fitted to. Ratios are cuBLAS time over ours (above 1: we are faster), each
the median of 3 interleaved rounds of CUDA-event timings of back-to-back
launches; ``graph`` rows replay the same calls from a CUDA graph
(cutlass_aot.tune.timing.time_us: device time only).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import time

from _common import gmean, header, seconds, write

SUITE_N = (32001, 50257, 4097, 11007)
SUITE_M = (1, 16, 128, 2048)
SUITE_K = 4096
SEED = 3005


def suite() -> list[tuple[int, int, int]]:
    return [(m, n, SUITE_K) for n in SUITE_N for m in SUITE_M]


def heldout(count: int, seed: int = SEED) -> list[tuple[int, int, int]]:
    """M log-uniform over 1..16384; N log-uniform over 96..57344, not a multiple
    of 8 (an odd edge); K log-uniform over 256..16384, rounded to a multiple of 8."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        m = max(1, round(2 ** rng.uniform(0, 14)))
        n = round(2 ** rng.uniform(math.log2(96), math.log2(57344)))
        if n % 8 == 0:
            n += rng.choice((1, 2, 3, 4, 5, 6, 7))
        k = max(256, round(2 ** rng.uniform(8, 14)) // 8 * 8)
        out.append((m, n, k))
    return out


def padded(n: int) -> int:
    return -(-n // 8) * 8


def measure(cache, torch, dt, m: int, n: int, k: int, rounds: int = 3) -> dict:
    """One shape, timed every way; times in microseconds."""
    from cutlass_aot.run import pitch  # noqa: PLC0415 - run side, with torch
    from cutlass_aot.tune.timing import time_us  # noqa: PLC0415

    np_ = padded(n)
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w_pad = torch.randn(np_, k, device="cuda", dtype=dt)
    b = w_pad[:n].t()
    out_pad = torch.empty(m, np_, device="cuda", dtype=dt)
    out = out_pad[:, :n]
    assert pitch.odd_edge(out) and pitch.aligned16(out), (m, n, k)
    ref = functools.partial(torch.mm, a, b, out=out)
    pick = functools.partial(cache.gemm, a, b, out=out)
    pad = functools.partial(cache.gemm, a, w_pad.t(), out=out_pad)
    pick()
    choice = cache.gemm.runner.choice_for(a, b, out)
    pad()
    iters = max(3, min(200, int(2e12 / (2.0 * m * n * k))))
    t = {"cublas": [], "pick": [], "padded": []}
    for _ in range(rounds):
        for name, fn in (("cublas", ref), ("pick", pick), ("padded", pad)):
            t[name].append(seconds(fn, iters) * 1e6)
    rec = {"m": m, "n": n, "k": k, "pick": choice.label(), "staged": bool(choice.staged)}
    rec.update({f"{name}_us": statistics.median(v) for name, v in t.items()})
    rec["ratio"] = statistics.median(c / p for c, p in zip(t["cublas"], t["pick"]))
    rec["edge_us"] = statistics.median(p - q for p, q in zip(t["pick"], t["padded"]))
    g = {name: time_us(fn, reps=3, graph=True) for name, fn in (("cublas", ref), ("pick", pick), ("padded", pad))}
    rec.update({f"{name}_graph_us": v for name, v in g.items()})
    rec["graph_ratio"] = g["cublas"] / g["pick"]
    rec["graph_edge_us"] = g["pick"] - g["padded"]
    # The edge route must leave out_pad's padding as it found it.
    out_pad[:, n:].fill_(7.0)
    pick()
    torch.cuda.synchronize()
    rec["padding_intact"] = bool((out_pad[:, n:] == 7.0).all().item())
    return rec


def row(dname: str, r: dict) -> str:
    return (f"| {dname} | {r['m']}x{r['n']}x{r['k']} | {r['cublas_us']:.1f} | {r['pick_us']:.1f} "
            f"({r['pick']}{' +copy' if r['staged'] else ''}) | {r['ratio']:.2f} | {r['padded_us']:.1f} | {r['edge_us']:+.1f} "
            f"({r['edge_us'] / r['pick_us']:.0%}) | {r['cublas_graph_us']:.1f} | {r['pick_graph_us']:.1f} "
            f"| {r['graph_ratio']:.2f} | {r['graph_edge_us']:+.1f} | {'yes' if r['padding_intact'] else 'NO'} |")


def summarize(records: list[dict]) -> list[str]:
    lines = []
    for (sample, dname) in dict.fromkeys((r["sample"], r["dtype"]) for r in records):
        recs = [r for r in records if (r["sample"], r["dtype"]) == (sample, dname)]
        ratios, graph = [r["ratio"] for r in recs], [r["graph_ratio"] for r in recs]
        share = [r["edge_us"] / r["pick_us"] for r in recs]
        lines.append(f"| {dname} | {sample} ({len(recs)}) | {gmean(ratios):.3f} (min {min(ratios):.2f}) "
                     f"| {gmean(graph):.3f} (min {min(graph):.2f}) | {statistics.median(share):.1%} "
                     f"(max {max(share):.1%}) | {statistics.median(r['graph_edge_us'] for r in recs):+.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--samples", default="suite,heldout")
    ap.add_argument("--count", type=int, default=16, help="size of the held-out sample")
    ap.add_argument("--budget-s", type=float, default=120.0, help="start no shape after this")
    ap.add_argument("--raw", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    samples, dnames = args.samples.split(","), args.dtypes.split(",")
    if not samples or set(samples) - {"suite", "heldout"}:
        ap.error(f"--samples {args.samples!r}: want suite, heldout or both")
    if not dnames or set(dnames) - {"bf16", "f16"}:
        ap.error(f"--dtypes {args.dtypes!r}: want bf16, f16 or both")
    if args.count < 1:
        ap.error("--count must be at least 1")

    import torch  # noqa: PLC0415 - GPU run only; the shape sets above are CPU-tested

    import cutlass_aot  # noqa: PLC0415

    start = time.monotonic()
    cache = cutlass_aot.open_cache(args.cache_dir)
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    sets = {"suite": suite(), "heldout": heldout(args.count)}
    plan = [(s, d, shape) for s in samples for d in dnames for shape in sets[s]]
    records = []
    for sample, dname, (m, n, k) in plan:
        if time.monotonic() - start > args.budget_s:
            break
        rec = measure(cache, torch, dtypes[dname], m, n, k) | {"sample": sample, "dtype": dname}
        records.append(rec)
        print(row(dname, rec), flush=True)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(records, f)
    text = header("Odd-edge outputs: the copy through scratch, against the padded problem and cuBLAS")
    text += __doc__.split("\n\n", 3)[3] + "\n"
    cols = ("| dtype | MxNxK | cuBLAS µs | pick µs (variant) | cuBLAS/pick | padded µs | edge cost µs "
            "(share of pick) | cuBLAS graph µs | pick graph µs | cuBLAS/pick, graph | edge cost, graph µs "
            "| padding intact |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for sample in dict.fromkeys(r["sample"] for r in records):
        title = "The suite" if sample == "suite" else f"Seeded random sample (seed {SEED}; never fitted to)"
        text += f"## {title}\n\n" + cols + "\n".join(row(r["dtype"], r) for r in records
                                                     if r["sample"] == sample) + "\n\n"
    text += ("## Geometric means\n\n| dtype | sample (shapes) | cuBLAS/pick | cuBLAS/pick, graph | edge "
             "cost, median share of pick | edge cost under graphs, median µs |\n|---|---|---|---|---|---|\n")
    text += "\n".join(summarize(records)) + "\n"
    if len(records) < len(plan):
        text += f"\nThe budget ended the run after {len(records)} of {len(plan)} shapes.\n"
    day = __import__("datetime").date.today().isoformat()
    print(f"wrote {write(f'{day}_h200_odd_edge.md', text, args.out)}")


if __name__ == "__main__":
    main()
