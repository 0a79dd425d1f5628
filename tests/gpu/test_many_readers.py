"""Many readers: 16 processes open one cache at once and run real GEMMs.

Runs on the device machine (`pytest --noconftest tests/gpu`). Each process
opens the cache, loads artifacts (verifying each sha256 before loading), runs
GEMMs over several signatures and sizes on fresh random inputs with poisoned
outputs, checks each against float64, and reports. No process may crash,
hang or see a wrong result; the cache must be byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

READERS = 16

WORKER = r"""
import os, sys, torch, cutlass_aot
cache = cutlass_aot.open_cache(os.environ["CUTLASS_AOT_CACHE_DIR"])
g = torch.Generator(device="cuda").manual_seed(int(sys.argv[1]))
bad = 0
calls = 0
for it in range(40):
    dt = (torch.bfloat16, torch.float16)[it % 2]
    m, n, k = [int(x) for x in torch.randint(1, 600, (3,), generator=g, device="cuda").tolist()]
    n, k = -(-n // 8) * 8, -(-k // 8) * 8
    a = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=dt, generator=g)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
    cache.gemm(a, w.t() if it % 3 else w.t().contiguous(), out)
    torch.cuda.synchronize()
    ref = a.double() @ w.double().t()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    calls += 1
    if not (err < 2e-2):
        bad += 1
print(f"calls={calls} bad={bad}")
sys.exit(1 if bad else 0)
"""


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_sixteen_processes_share_one_cache():
    cache_dir = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not cache_dir:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    before = _digest(Path(cache_dir))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(seed)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for seed in range(READERS)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        results.append((p.returncode, out.strip().splitlines()[-1] if out.strip() else ""))
    print("\n".join(f"reader {i}: rc={rc} {line}" for i, (rc, line) in enumerate(results)))
    assert all(rc == 0 for rc, _ in results), results
    assert _digest(Path(cache_dir)) == before, "a reader changed the cache"
