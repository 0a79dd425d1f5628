"""A service process runs a GEMM from a pulled cache (GPU; no DSL needed).

    python3 benchmarks/pulled_cache_smoke.py [CACHE_DIR] [--out FILE]

CACHE_DIR defaults to $CUTLASS_AOT_CACHE_DIR. Typically it was filled by
`cutlass-aot pull REF --arch sm_90a --cache-dir CACHE_DIR` on another machine
and copied here, or pulled here. The script acts as the service: it imports
only the run side, opens the cache (trust rules, full index validation),
runs every usable bf16/f16 rank-2 signature once on a 512x4096x4096-ish
problem into a NaN-filled ``out`` and compares with an fp64 reference through
the benchmarks' shared check (``_common.max_rel_err``), and checks that no CuTe DSL module and no
build-side module was imported. Prints one JSON document; exit 0 when every
GEMM matched torch, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("cache_dir", nargs="?", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    if not args.cache_dir:
        ap.error("give CACHE_DIR or set CUTLASS_AOT_CACHE_DIR")

    import torch  # noqa: PLC0415
    from _common import max_rel_err  # noqa: PLC0415 - stdlib-only at import

    import cutlass_aot  # noqa: PLC0415

    t0 = time.perf_counter()
    cache = cutlass_aot.open_cache(args.cache_dir)
    opened = time.perf_counter() - t0
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    results, skipped = [], []
    m, n, k = 512, 4096, 4096
    for sig in cache.signatures():
        f = sig.as_dict()["fields"]
        if f.get("rank") != 2 or f.get("a_major") != "k" or f.get("d_major") != "n" or f.get("c") is not None:
            continue
        # A plain call (no bias, no activation, 16-byte aligned) dispatches only to the plain
        # signature, so epilogue and low-alignment signatures would be mislabeled here.
        if f.get("bias") or f.get("act") not in (None, "none") or f.get("align", 16) != 16:
            skipped.append(sig.text())
            continue
        a = torch.randn(m, k, device="cuda", dtype=dtypes[f["a"]])
        if f["b_major"] == "k":
            b = torch.randn(n, k, device="cuda", dtype=dtypes[f["b"]]).t()  # w.t(), the nn.Linear case
        else:
            b = torch.randn(k, n, device="cuda", dtype=dtypes[f["b"]])
        # NaN-filled, so an element the kernel never wrote fails the check.
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtypes[f["d"]])
        t1 = time.perf_counter()
        cache.gemm(a, b, out=out)
        torch.cuda.synchronize()
        first = time.perf_counter() - t1
        err = max_rel_err(out, a.double() @ b.double())
        results.append({"signature": sig.text(), "max_rel_err": err, "ok": err < 2e-2,
                        "first_call_s": round(first, 4)})
    leaked = sorted(name for name in sys.modules
                    if name == "cutlass" or name.startswith(("cutlass.", "cutlass_aot.builder",
                                                             "cutlass_aot.remote")))
    doc = {
        "cache_dir": str(Path(args.cache_dir).resolve()),
        "device": torch.cuda.get_device_name(),
        "entries": len(cache.entries),
        "unusable": {k[:12]: why for k, why in cache.unusable.items()},
        "open_cache_s": round(opened, 4),
        "gemms": results,
        "skipped_epilogue_or_lowalign_signatures": skipped,
        "dsl_or_build_side_imported": leaked,
        "ok": bool(results) and all(r["ok"] for r in results) and not leaked,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
