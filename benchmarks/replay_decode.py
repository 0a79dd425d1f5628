"""Replay the dispatcher's decode picks on recorded option times (CPU only).

Input: bench_decode.py's ``--raw`` JSON (every option of every decode
problem timed under CUDA graph replay, and cuBLAS) and a selection table.
For each problem, the pick is ``select.choose``'s among the recorded options
with the table's rows for the dtype's nn.Linear signature: the exact row,
else the row below whose tiles cover M, else the current model. The report
gives pick / cuBLAS (cuBLAS time over the pick option's recorded time) and
the pick's regret (its time over the fastest option's) per M and overall,
and how many picks each rule made. bench_decode.py measures the picks live;
this shows what a selection change does to them without a GPU.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from _common import gmean, load_raw
from fit_model import parse_label

from cutlass_aot.run import select
from cutlass_aot.signature import gemm_signature


def table_rows(path: str, arch: str = "sm_90a") -> dict[str, dict[tuple, tuple]]:
    """dtype -> {(M, N, K, L): (schedule, splits, runner-up label, margin, us)}:
    the table's rows for the plain nn.Linear signature bench_decode.py calls
    (bf16 and f16), as ``select.choose`` takes them (``tables.bind``)."""
    doc = json.load(open(path, encoding="utf-8"))
    sigs = {gemm_signature(arch, a=dt, b=dt, d=dt, c=None, a_major="k", b_major="k", d_major="n",
                           rank=2).text(): dt for dt in ("bf16", "f16")}
    out: dict[str, dict[tuple, tuple]] = defaultdict(dict)
    for r in doc["rows"]:
        dtype = sigs.get(r["signature"])
        if dtype is not None:
            cand = select.candidate_from_variant("table", r["variant"])
            out[dtype][(r["m"], r["n"], r["k"], r["l"])] = (
                cand.schedule, int(r["splits"]), r.get("runner_up"), r.get("margin"),
                None if "steady_ms" in r else float(r["us"]))
    return out


def replay(raw: str, table: str | None, sms: int = 132) -> dict:
    rows = table_rows(table) if table else {}
    by_m, regrets, sources = defaultdict(list), [], defaultdict(int)
    for rec in load_raw(raw):
        m, n, k = rec["m"], rec["n"], rec["k"]
        times = dict(rec["options"])
        cands = {}
        for label in times:
            cand, _ = parse_label(label, label)
            cands.setdefault(cand.schedule, cand)
        choice = select.choose(list(cands.values()), m, n, k, 1, sms, rows.get(rec["dtype"]))
        label = choice.label()
        if label not in times:  # a split count the sweep did not time: the model among those it did
            opts = [(*parse_label(lab, lab), lab) for lab in times]
            label, choice = select.model_pick(opts, m, n, k, 1, sms)[2], None
        sources[choice.source if choice else "model (untimed split)"] += 1
        by_m[m].append(rec["cublas_us"] / times[label])
        regrets.append(times[label] / min(times.values()))
    allv = [x for v in by_m.values() for x in v]
    return {"all": gmean(allv), "min": min(allv), "by_m": {m: gmean(v) for m, v in sorted(by_m.items())},
            "regret": gmean(regrets), "regret_worst": max(regrets), "sources": dict(sources),
            "n": len(allv)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--table", default="configs/sm90-h200.selection.json",
                    help="the selection table (empty: the model alone)")
    args = ap.parse_args()
    for raw in args.raw:
        out = replay(raw, args.table or None)
        print(f"{raw}: n={out['n']} (picks by {out['sources']}); pick / cuBLAS geomean "
              f"{out['all']:.3f}, min {out['min']:.2f}; regret geomean {out['regret']:.3f}, "
              f"worst {out['regret_worst']:.3f}")
        print("  by M: " + ", ".join(f"{m}: {v:.3f}" for m, v in out["by_m"].items()))


if __name__ == "__main__":
    main()
