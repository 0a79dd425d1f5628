"""`cutlass-aot explain` against the runner itself, on the GPU.

Self-contained (run with `pytest --noconftest tests/gpu`). explain answers
on a CPU from the cache and its table (cutlass_aot/explain.py); here, for
seeded random aligned problems and the table's own rows, in both dtypes and
both B layouts, it must name the option and the source (table, table-below,
table-above, model) that ``GemmRunner.choice_for`` resolves on this GPU's tensors, with
autotune off. A GPU the cache has no table for is explained by its SM count
(the model alone), as dispatch then runs it.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from test_gemm_gpu import device_cache

from cutlass_aot.explain import explain
from cutlass_aot.run.dispatch import device_info
from cutlass_aot.signature import gemm_signature

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


def _problems(cache, dtype: str) -> list[tuple[int, int, int]]:
    rng = random.Random(5454)
    shapes = [(max(1, int(2 ** rng.uniform(0, 14))), 8 * rng.randint(32, 3072), 8 * rng.randint(32, 3072))
              for _ in range(24)]
    # and rows of the table (where the cache ships one for this GPU), plus one M above each
    _, sms, name, cc = device_info(0)
    for rec in cache.tables.values():
        if rec["gpu"]["name"] == name:
            sig = gemm_signature("sm_90a", a=dtype, b=dtype, d=dtype, c=None, a_major="k",
                                 b_major="k", d_major="n", rank=2)
            rows = cache.table_rows(sig, name, sms, cc) or {}
            picked = sorted(rows)[:: max(1, len(rows) // 12)]
            shapes += [(m, n, k) for m, n, k, batch in picked if batch == 1]
            shapes += [(m + 1, n, k) for m, n, k, batch in picked if batch == 1]
    return shapes


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_explain_names_what_the_runner_resolves(dtype, b_major):
    cache = device_cache()
    runner = cache.gemm.runner
    runner.set_autotune(0)
    _, sms, name, _ = device_info(0)
    has_table = any(rec["gpu"]["name"] == name for rec in cache.tables.values())
    where = {"gpu": name} if has_table else {"sms": sms}
    problems = _problems(cache, dtype)
    report = explain(os.environ["CUTLASS_AOT_CACHE_DIR"], [(m, n, k, 1) for m, n, k in problems],
                     dtype=dtype, b_major=b_major, top=0, **where)
    mismatched = []
    for (m, n, k), got in zip(problems, report["problems"]):
        dt = TORCH[dtype]
        a = torch.empty(m, k, device="cuda", dtype=dt)
        b = (torch.empty(n, k, device="cuda", dtype=dt).t() if b_major == "k"
             else torch.empty(k, n, device="cuda", dtype=dt))
        out = torch.empty(m, n, device="cuda", dtype=dt)
        ch = runner.choice_for(a, b, out)
        if (ch.label(), ch.source) != (got["runs"], got["source"]):
            mismatched.append(((m, n, k), (ch.label(), ch.source), (got["runs"], got["source"])))
    assert not mismatched, mismatched[:5]
    assert len(problems) >= 24
