"""GPU correctness of the gemv family (decode GEMMs on CUDA cores).

Self-contained like test_gemm_gpu.py (run with `pytest --noconftest tests/gpu`
on the device machine, cache in CUTLASS_AOT_CACHE_DIR). Fresh random inputs,
NaN-poisoned outputs, a float64 reference; NaN never passes. The operands'
padding past K holds random values, so a kernel that read past K would fail.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_gemm_gpu import (
    ACTS,
    TORCH,
    _entries,
    assert_cases_pass,
    device_cache,
    raw_caller,
    rel_err,
    run_case,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cache():
    return device_cache()


def _gemv_entries(cache):
    return [e for e in _entries(cache) if e.variant.get("gemv")]


def test_every_gemv_variant_at_odd_sizes(cache):
    """M across one pass, a pass plus one token and several passes; N not a
    multiple of the CTA's rows (and below it); K below one 16-byte chunk
    per thread, with a chunk across its end (K = 1001, 4099), and long."""
    entries = _gemv_entries(cache)
    assert entries, "the cache has no gemv variants (configs/sm90.yaml ships them)"
    failures, checked = [], 0
    for e in entries:
        sig = dict(e.signature.fields)
        call = raw_caller(cache, e)
        tokens = int(e.variant["tile"].split("x")[0])
        for m in sorted({1, 2, 3, tokens, tokens + 1, 2 * tokens + 3, 17}):
            for n, k in ((1, 8), (7, 1001), (130, 72), (1000, 4099), (4096, 4096)):
                checked += 1
                try:
                    run_case(call, sig, m, n, k, 2, with_c=sig["c"] is not None)
                except AssertionError as exc:
                    failures.append(f"{e.signature} gemv {e.variant['tile']} M={m} N={n} K={k}: "
                                    f"{str(exc).splitlines()[0]}")
    assert_cases_pass(failures, checked)


def test_gemv_bits_identical_run_to_run(cache):
    """The reduction order is fixed: the same inputs give the same bits."""
    for e in _gemv_entries(cache):
        sig = dict(e.signature.fields)
        dt = TORCH[sig["a"]]
        call = raw_caller(cache, e)
        a = torch.randn(3, 14336, device="cuda", dtype=dt)
        w = torch.randn(4104, 14336, device="cuda", dtype=dt)
        bias = torch.randn(4104, device="cuda", dtype=dt) if sig.get("bias") else None
        # A with-C variant (r71's residual twins) takes C at beta 0.5.
        c, beta = ((torch.randn(3, 4104, device="cuda", dtype=dt), 0.5) if sig["c"] is not None
                   else (None, 0.0))
        outs = []
        for _ in range(3):
            d = torch.full((3, 4104), float("nan"), device="cuda", dtype=dt)
            call(a, w.t(), d, c, 1.0, beta, bias=bias)
            outs.append(d)
        torch.cuda.synchronize()
        assert all(torch.equal(outs[0], o) for o in outs[1:]), f"gemv {e.variant['tile']} varies"


def test_table_rows_naming_gemv_are_served_by_it(cache):
    """Through the public API at each table row that names a gemv variant:
    the dispatcher serves it from the table, and the result is right."""
    runner = cache.gemm.runner
    by_text = {sig.text(): sig for sig in cache.signatures()}
    # Only a table measured on this GPU kind binds (the shipped one is the
    # H200's; r49 ran the suite on an H100).
    here = (torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count)
    rows = [r for rec in cache.tables.values()
            if (rec["gpu"]["name"], rec["gpu"]["sm_count"]) == here
            for r in json.loads((cache.path / rec["path"]).read_text())["rows"]
            if r["variant"].get("gemv")]
    if not rows:
        pytest.skip("the cache has no selection table for this GPU that names a gemv variant")
    for row in rows:
        sig = dict(by_text[row["signature"]].fields)
        dt = TORCH[sig["a"]]
        a = torch.randn(row["m"], row["k"], device="cuda", dtype=dt)
        w = torch.randn(row["n"], row["k"], device="cuda", dtype=dt)
        bias = torch.randn(row["n"], device="cuda", dtype=TORCH[sig["bias"]]) if sig.get("bias") else None
        act = sig.get("act")
        # A residual row (with C, since r71) is served to a call that passes c.
        c = torch.randn(row["m"], row["n"], device="cuda", dtype=TORCH[sig["c"]]) if sig["c"] is not None else None
        choice = runner.choice_for(a, w.t(), c=c, bias=bias, act=act)
        assert choice.candidate.gemv and choice.source == "table", (row["m"], row["n"], choice.label())
        out = cache.gemm(a, w.t(), c=c, bias=bias, act=act, beta=0.5)
        ref = (a.double() @ w.t().double() + (0 if bias is None else bias.double())
               + (0 if c is None else 0.5 * c.double()))
        assert rel_err(out, ACTS[act](ref)) < 1e-2
