"""Should a table row lend its variant to nearby shapes? Replayed on recorded timings (CPU only).

For each shape of ``bench_selection.py --raw`` files (every (variant, split)
option timed on the GPU), the selection table's row for that exact problem
is removed (leave-one-out, so the table's own problems test the rule too),
and three rules pick among the recorded options:

* ``nearest 0.5``: the rule run/select.py had until 2026-11-30: the nearest
  row of the signature within log distance 0.5 (``select.distance``) lends
  its variant, with the split count re-derived by the model;
* ``nearest, same waves``: the same, only when the row's variant has as many
  waves of tiles at this shape as at the row's;
* ``model``: the analytic model alone (what select.choose does now).

Reports each rule's regret (pick time / best option time): geometric mean,
p90, worst, and how many picks came from a row.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math

from _common import header, load_raw, write
from fit_model import parse_label

from cutlass_aot.run import select

RADIUS = 0.5


def table_rows(table: dict, dtype: str) -> dict:
    """(M, N, K, L) -> schedule, splits of the nn.Linear signature of ``dtype``."""
    sig = (f"gemm[sm_90a](a={dtype},a_major=k,align=16,b={dtype},b_major=k,c=-,d={dtype},"
           "d_major=n,rank=2)")
    return {(r["m"], r["n"], r["k"], r["l"]): (select.candidate_from_variant("", r["variant"]).schedule,
                                               r["splits"])
            for r in table["rows"] if r["signature"] == sig}


def waves(c: select.Candidate, m: int, n: int, sms: int = 132) -> int:
    _, _, tiles = select._tiles(c, m, n, 1)
    size = c.cluster_m * c.cluster_n
    return -(-(tiles // size) // max(1, sms // size))


def pick(rule: str, rec: dict, rows: dict, cands: dict) -> tuple[tuple, str]:
    m, n, k = rec["m"], rec["n"], rec["k"]
    if rule != "model" and rows:
        near = min(rows, key=lambda p: select.distance((m, n, k, 1), p))
        c = cands.get(rows[near][0])
        if select.distance((m, n, k, 1), near) <= RADIUS and c is not None:
            ok = bool(select.split_choices(c, m, n, k, 1, 132))
            if rule == "nearest, same waves" and waves(c, m, n) != waves(c, near[0], near[1]):
                ok = False
            if ok:
                ch = select.model_choice([c], m, n, k, 1, 132)
                return (c.schedule, ch.splits), "row"
    ch = select.model_choice(list(cands.values()), m, n, k, 1, 132)
    return (ch.candidate.schedule, ch.splits), "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--table", default="configs/sm90-h200.selection.json")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    table = json.load(open(args.table))
    text = header("Table rows for nearby shapes: leave-one-out replay")
    text += (f"Table: `{args.table}` ({len(table['rows'])} rows). Each shape's own row removed; "
             "regret = recorded time of the pick / of the best recorded option.\n\n"
             "| raw | rule | n | geomean regret | p90 | worst | picks from a row (their geomean) |\n"
             "|---|---|---|---|---|---|---|\n")
    for path in args.raw:
        recs = load_raw(path)
        for rule in ("nearest 0.5", "nearest, same waves", "model"):
            regrets, from_row = [], []
            for rec in recs:
                rows = table_rows(table, rec["dtype"])
                rows.pop((rec["m"], rec["n"], rec["k"], 1), None)
                times, cands = {}, {}
                for label, key, splits, us, _ in rec["options"]:
                    c, _ = parse_label(label, key)
                    times[(c.schedule, splits)] = us
                    cands[c.schedule] = c
                choice, source = pick(rule, rec, rows, cands)
                r = times[choice] / min(times.values())
                regrets.append(r)
                if source == "row":
                    from_row.append(r)
            r = sorted(regrets)
            g = math.exp(sum(map(math.log, r)) / len(r))
            gr = f"{len(from_row)} ({math.exp(sum(map(math.log, from_row)) / len(from_row)):.3f})" \
                if from_row else "0"
            text += (f"| {path.split('/')[-1]} | {rule} | {len(r)} | {g:.3f} | "
                     f"{r[int(0.9 * (len(r) - 1))]:.3f} | {r[-1]:.3f} | {gr} |\n")
    print(text)
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    print("wrote", write(f"{today}_table_rule_replay.md", text, args.out))


if __name__ == "__main__":
    main()
