"""Replay the dispatcher's decode picks on recorded option times (CPU only).

Input: bench_decode.py's ``--raw`` JSON (every option of every decode
problem timed under CUDA graph replay, and cuBLAS) and the selection table
the run's cache shipped. For each problem, the pick is the table's row where
the table has this exact (M, N, K) for the dtype's nn.Linear signature, else
the current model's (run/select.py) among the recorded options; the report
gives pick / cuBLAS (cuBLAS time over the pick option's recorded time) per
M and overall, and how many picks the model made. bench_decode.py measures
the picks live; this shows what a model change does to them without a GPU.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from _common import gmean, load_raw
from fit_model import parse_label

from cutlass_aot.run import select
from cutlass_aot.signature import gemm_signature


def table_labels(path: str, arch: str = "sm_90a") -> dict[tuple, str]:
    """(dtype, m, n, k) -> the option label of the table's row, for the
    plain nn.Linear signature bench_decode.py calls (bf16 and f16)."""
    doc = json.load(open(path, encoding="utf-8"))
    sigs = {gemm_signature(arch, a=dt, b=dt, d=dt, c=None, a_major="k", b_major="k", d_major="n",
                           rank=2).text(): dt for dt in ("bf16", "f16")}
    out = {}
    for r in doc["rows"]:
        dtype = sigs.get(r["signature"])
        if dtype is not None:
            cand = select.candidate_from_variant("table", r["variant"])
            out[(dtype, r["m"], r["n"], r["k"])] = select.Choice(cand, int(r["splits"]), "table").label()
    return out


def replay(raw: str, table: str, sms: int = 132) -> dict:
    rows = table_labels(table)
    by_m, model_picks, missing = defaultdict(list), 0, 0
    for rec in load_raw(raw):
        m, n, k = rec["m"], rec["n"], rec["k"]
        times = dict((label, us) for label, us in rec["options"])
        label = rows.get((rec["dtype"], m, n, k))
        if label not in times:
            if label is not None:
                missing += 1
            opts = [(*parse_label(lab, lab), lab) for lab, _ in rec["options"]]
            label = select.model_pick(opts, m, n, k, 1, sms)[2]
            model_picks += 1
        by_m[m].append(rec["cublas_us"] / times[label])
    allv = [x for v in by_m.values() for x in v]
    return {"all": gmean(allv), "min": min(allv), "by_m": {m: gmean(v) for m, v in sorted(by_m.items())},
            "model_picks": model_picks, "n": len(allv), "table_rows_missing": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--table", default="configs/sm90-h200.selection.json")
    args = ap.parse_args()
    out = replay(args.raw, args.table)
    print(f"{args.raw}: n={out['n']} ({out['model_picks']} model picks, "
          f"{out['table_rows_missing']} table rows naming an option not recorded); "
          f"pick / cuBLAS geomean {out['all']:.3f}, min {out['min']:.2f}")
    print("  by M: " + ", ".join(f"{m}: {v:.3f}" for m, v in out["by_m"].items()))


if __name__ == "__main__":
    main()
