"""Keep a shipped selection table binding after a kernel-source edit that did not change the code.

A table row binds to its variant by the digest of the family's kernel sources
it was measured on (cutlass_aot/tables.py). Any edit to those files, even one
that compiles to the same bytes (a refactor, a comment), makes every row of
the family stale until a GPU re-tunes it. Rows also record the sha256 of the
artifact they timed, so a rebuild proves which rows still describe the same
code: this script moves those rows to the new source digest, and lists the
rest, which need `cutlass-aot tune` on the GPU.

    python build_scripts/restamp_table.py configs/sm90-h200.selection.json --cache-dir CACHE

CACHE is a build of the current sources (with the same toolchain as the
build that was measured). When this machine's toolchain is not the one the
timed build came from (its artifacts differ even for untouched code),
``--baseline OLD`` names a build of the sources the table was measured on,
made here with the same toolchain as CACHE: a row whose variant OLD and
CACHE build to the same bytes is moved too (``rebuilt``), since the edit did
not change that variant's code. Rows measured on the current sources that
lack an ``artifact`` get it from CACHE, which must then be the build that
was timed.
The table is rewritten in place (or to ``--out``) as canonical JSON. Exits 1
when a row's code changed (it stays in the table, stale, for a re-tune) or
CACHE lacks the variant a row names (the row stays as it was: build that
variant into CACHE and run again); 2 on bad input, including a CACHE that
holds none of the table's variants (the wrong cache: nothing is written)
and one that still lists an older build of a variant next to the new one
(an incremental build before `cutlass-aot gc`: a row could meet the old
entry; nothing is written); else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cutlass_aot import tables
from cutlass_aot.errors import CutlassAotError
from cutlass_aot.layout import read_index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path, help="a selection table file (e.g. configs/sm90-h200.selection.json)")
    ap.add_argument("--cache-dir", type=Path, required=True, help="a cache built from the current sources")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a build, with CACHE's toolchain, of the sources the table was measured on")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: TABLE, in place)")
    args = ap.parse_args(argv)
    try:
        doc = tables.load_table_file(args.table)
        index = read_index(args.cache_dir, missing_ok=False)
        old = read_index(args.baseline, missing_ok=False) if args.baseline else None
    except CutlassAotError as exc:
        print(f"restamp_table: {exc}", file=sys.stderr)
        return 2
    entries = [tables.entry_of(r) for r in index["entries"].values()]
    baseline = [tables.entry_of(r) for r in old["entries"].values()] if old else None
    if baseline is not None and not any(e[3] in {r["kernel_sources"] for r in doc["rows"]}
                                        for e in baseline):
        print(f"restamp_table: {args.baseline} was not built from the sources any row of "
              f"{args.table} was measured on: give --baseline a build of those sources "
              "(nothing written)", file=sys.stderr)
        return 2
    try:
        rows, counts, changed = tables.restamp(doc["rows"], entries, baseline)
    except CutlassAotError as exc:
        print(f"restamp_table: {args.cache_dir}: {exc} (nothing written)", file=sys.stderr)
        return 2
    if rows and counts["missing_variant"] == len(rows):
        print(f"restamp_table: {args.cache_dir} holds none of the {len(rows)} variants "
              f"{args.table} names: give --cache-dir a build of the manifest the table was "
              "tuned on (nothing written)", file=sys.stderr)
        return 2
    doc = dict(doc, rows=rows)
    tables.validate_table(doc, str(args.out or args.table))
    try:
        (args.out or args.table).write_bytes(tables.dumps_table(doc))
    except OSError as exc:
        print(f"restamp_table: cannot write {args.out or args.table}: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in counts.items()), f"-> {args.out or args.table}")
    status = 0
    if counts["missing_variant"]:
        print(f"{counts['missing_variant']} rows name variants {args.cache_dir} lacks and were "
              "left as they were: build those variants into it and run again", file=sys.stderr)
        status = 1
    if changed:
        for r in changed[:10]:
            print(f"  changed: {r['signature']} {r['m']}x{r['n']}x{r['k']} {r.get('label', '')}")
        print(f"{len(changed)} rows measured code that changed: re-run `cutlass-aot tune` on the "
              "GPU for them", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
