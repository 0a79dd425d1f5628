"""Sustained-load figures over several sustained_probe.py runs: each option against cuBLAS (CPU).

sustained_probe.py reports one shape at a time. This reads its raws and puts
every (dtype, shape) on one row: cuBLAS / option for each function timed
(last quarter of each phase, the median over rounds), the model's pick
marked, and nvidia-smi's memory-busy share of the pick's phase. Below the
rows, per option label: the geomean of cuBLAS / option over the shapes that
timed it, and the same for the model's pick and for the best option timed
per shape. The pick is recomputed with this checkout's model (the probe
reports it, its raw does not), so run it at the commit that measured.
"""

from __future__ import annotations

import argparse
import statistics

from _common import gmean, header, load_raw, write


def rows_of(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """{(dtype, m, n, k): {function: {"us": median last-quarter µs over
    rounds, "mem": median memory-busy %}}} from sustained_probe raws."""
    per: dict[tuple, dict[str, list]] = {}
    for r in records:
        if r.get("us_last") is None:
            continue
        key = (r["dtype"], r["m"], r["n"], r["k"])
        per.setdefault(key, {}).setdefault(r["name"], []).append(r)
    out: dict[tuple, dict[str, dict]] = {}
    for key, fns in per.items():
        out[key] = {}
        for name, recs in fns.items():
            mems = [x["mem_util"] for x in recs if x.get("mem_util") is not None]
            out[key][name] = {"us": statistics.median(x["us_last"] for x in recs),
                              "mem": statistics.median(mems) if mems else None}
    return out


def summarize(rows: dict[tuple, dict[str, dict]], picks: dict[tuple, str]) -> str:
    """The report's tables (see the module docstring); ``picks`` names the
    model's pick per (dtype, m, n, k)."""
    labels = sorted({f for fns in rows.values() for f in fns if f != "cuBLAS"})
    text = ("| dtype | shape | model's pick | pick mem busy % | "
            + " | ".join(labels) + " |\n|---|---|---|---|" + "---|" * len(labels) + "\n")
    by_label: dict[str, list[float]] = {x: [] for x in labels}
    pick_r, best_r = [], []
    for key in sorted(rows):
        fns = rows[key]
        if "cuBLAS" not in fns:
            continue
        cub = fns["cuBLAS"]["us"]
        pick = picks.get(key)
        cells = []
        for x in labels:
            if x in fns:
                ratio = cub / fns[x]["us"]
                by_label[x].append(ratio)
                cells.append(f"**{ratio:.3f}**" if x == pick else f"{ratio:.3f}")
            else:
                cells.append("")
        ours = [cub / f["us"] for name, f in fns.items() if name != "cuBLAS"]
        best_r.append(max(ours))
        mem = "n/a"
        if pick in fns:
            pick_r.append(cub / fns[pick]["us"])
            mem = "n/a" if fns[pick]["mem"] is None else f"{fns[pick]['mem']:.0f}"
        dtype, m, n, k = key
        text += f"| {dtype} | {m}x{n}x{k} | {pick or 'n/a'} | {mem} | " + " | ".join(cells) + " |\n"
    text += "\n| option | shapes | geomean cuBLAS / option | min |\n|---|---|---|---|\n"
    for name, xs in [("the model's pick", pick_r), ("best timed per shape", best_r),
                     *[(x, by_label[x]) for x in labels]]:
        if xs:
            text += f"| {name} | {len(xs)} | {gmean(xs):.3f} | {min(xs):.3f} |\n"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="+", help="sustained_probe.py --raw files (plain or .xz)")
    ap.add_argument("--cache-dir", default=None, help="the cache the model's picks come from")
    ap.add_argument("--sms", type=int, default=132, help="the measuring GPU's SM count")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: dict[tuple, dict[str, dict]] = {}
    for path in args.raw:
        for key, fns in rows_of(load_raw(path)).items():
            rows.setdefault(key, {}).update(fns)

    from _common import linear_candidates  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415 - after argument errors
    from cutlass_aot.run import select  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    cands = {}
    picks = {}
    for dtype, m, n, k in rows:
        if dtype not in cands:
            cands[dtype] = linear_candidates(cache, dtype, sms=args.sms)[1]
        picks[(dtype, m, n, k)] = select.ranked_choices(cands[dtype], m, n, k, 1, args.sms)[0][1].label()
    text = header("Sustained load: each option against cuBLAS, over sustained_probe runs")
    text += ("Raws: " + ", ".join(f"`{p}`" for p in args.raw) + ". cuBLAS / option from the "
             "last quarter of each phase (median over rounds); bold: the model's pick (this "
             f"checkout's model, {args.sms} SMs).\n\n")
    text += summarize(rows, picks)
    write("sustained_summary", text, args.out)


if __name__ == "__main__":
    main()
