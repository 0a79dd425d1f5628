"""Time to open a cache whose index lists 1,000 entries (run side, no GPU).

Builds a synthetic index from real records of an existing cache (each copied
under a fresh key, so every record is as large and as validated as a real
one), then times `Cache(path)`: trust checks, JSON parse, validation of
every record, sorting into signatures. Median of 30 opens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import header, write


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from cutlass_aot.run.load import Cache  # noqa: PLC0415

    src = json.loads((Path(args.cache_dir) / "index.json").read_text())
    records = list(src["entries"].values())
    tmp = Path(tempfile.mkdtemp(prefix="cutlass-aot-index-"))
    try:
        os.chmod(tmp, 0o755)
        entries = {}
        for i in range(args.entries):
            rec = dict(records[i % len(records)])
            key = hashlib.sha256(f"synthetic-{i}".encode()).hexdigest()
            rec["key"] = key
            rec["path"] = f"entries/{key}/kernel.so"
            entries[key] = rec
        index = dict(src, entries=entries)
        (tmp / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
        size = (tmp / "index.json").stat().st_size
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            cache = Cache(tmp)
            times.append(time.perf_counter() - t0)
        assert len(cache.entries) == args.entries, len(cache.entries)
    finally:
        shutil.rmtree(tmp)
    med = statistics.median(times) * 1e3
    text = header(f"Opening an index of {args.entries} entries (run side)")
    text += (f"index.json of {size / 1e6:.2f} MB; `Cache(path)` = trust checks + parse + per-record "
             f"validation + grouping by signature. Python {sys.version.split()[0]}.\n\n"
             f"| entries | median ms | min ms | max ms |\n|---|---|---|---|\n"
             f"| {args.entries} | {med:.1f} | {min(times) * 1e3:.1f} | {max(times) * 1e3:.1f} |\n\n"
             f"Goal: ≤ 20 ms.\n")
    print(text)
    print("wrote", write("open_index.md", text, args.out))


if __name__ == "__main__":
    main()
