"""Picks of select.choose on a seeded random sample, CPU only: JSON {signature shape: (label, source)}.

Run it under two checkouts (PYTHONPATH) on one cache and compare the JSON to show that a
selection change leaves the picks alone. Seed 4747, never fitted: 400 shapes, M log-uniform
over 1..65536, N and K multiples of 8 over 256..57344, on every 16-byte sm_90a signature.
Usage: PYTHONPATH=<checkout> python benchmarks/pick_identity.py CACHE_DIR [--index-limit] > picks.json

--index-limit first drops the candidates dispatch keeps from operands past 2**31 elements
(select.within_index_limit, r49), on each shape's contiguous nn.Linear operands (C like D
where the signature has one): the picks with and without it differ only where it applied.
"""
import json
import math
import random
import sys

from cutlass_aot.layout import GEMM_SPLITK_ABI
from cutlass_aot.run import select
from cutlass_aot.run.load import Cache

cache = Cache(sys.argv[1])
index_limit = "--index-limit" in sys.argv[2:]
rng = random.Random(4747)
def dim():
    return 8 * rng.randint(32, 57344 // 8)
shapes = [(max(1, int(round(math.exp(rng.uniform(0, math.log(65536)))))), dim(), dim()) for _ in range(400)]
out = {}
for sig, entries in sorted(cache.by_signature.items(), key=lambda kv: str(kv[0])):
    if sig.arch != "sm_90a" or sig.get("align") not in (None, 16):
        continue
    cands = select.candidates((e.key, dict(e.variant, split_k=e.record["abi"] == GEMM_SPLITK_ABI), e.record["built_at"]) for e in entries)
    rows = cache.table_rows(sig, "NVIDIA H200", 132, "9.0")
    for m, n, k in shapes:
        usable = cands
        if index_limit:
            spans = {"a": m * k, "b": k * n, "out": m * n} | ({"c": m * n} if sig.get("c") else {})
            usable = select.within_index_limit(cands, spans)
        if not usable:
            out[f"{sig} {m}x{n}x{k}"] = ("refused", "index-limit")
            continue
        ch = select.choose(usable, m, n, k, 1, 132, rows, 2, 2)
        out[f"{sig} {m}x{n}x{k}"] = (ch.label(), ch.source)
json.dump(out, sys.stdout)
