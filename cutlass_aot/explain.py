"""Explain: which prebuilt option dispatch runs for a GEMM problem, and why, with no GPU.

CLI side (``cutlass-aot explain``); imports the core and the run side's pure
modules (select, load), never torch or the CuTe DSL, so it runs on a CI
machine or a laptop against the cache a service ships.

It mirrors the run side's resolution (run/dispatch.py ``_resolve``) for a
16-byte aligned call with contiguous operands: A row-major, B either the
transpose of a row-major weight (``x @ w.t()``, nn.Linear) or row-major,
D (and C) row-major. In order: the call's signature
(``select.call_signature``); the first signature of
``select.signature_order`` the cache holds entries for; its candidates that
fit the GPU's shared memory and reach the operands
(``select.fits_device``, ``select.within_index_limit``); then
``select.choose`` with the cache's selection table for the named GPU: the
table's row for the problem, a row at a smaller M whose tiles cover it, or
the model. Beside the pick it lists the model's first options with their
estimates.

What it cannot see, and says so: a call with other strides or below 16-byte
alignment (staged or low-alignment routes), an ``out`` whose rows end off a
16-byte boundary (written through scratch), and autotune (a model pick timed
against the model's next options at the first call). For those, ask the
runner on the GPU (``GemmRunner.choice_for``).
"""

from __future__ import annotations

import os
import re
from typing import Any

from .archs import parse_arch, runnable_archs
from .errors import KernelNotFoundError, UsageError
from .run import select
from .run.load import Cache
from .signature import ARCH_BY_CAPABILITY, GEMM_ACTS

DTYPES = ("bf16", "f16")
OUT_DTYPES = ("bf16", "f16", "f32")
BIAS_DTYPES = ("bf16", "f16", "f32")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
_PROBLEM = re.compile(r"(\d+)x(\d+)x(\d+)(?:x(\d+))?")


def parse_problem(text: str) -> tuple[int, int, int, int]:
    """(M, N, K, L) of ``MxNxK`` or ``MxNxKxL`` (L: a batch, rank 3), each at least 1."""
    match = _PROBLEM.fullmatch(text.strip().lower())
    dims = None if match is None else [int(g) for g in match.groups(default="0")]
    if dims is None or min(dims[:3]) < 1 or (match.group(4) is not None and dims[3] < 1):
        raise UsageError(f"problem {text!r} is not MxNxK or MxNxKxL with every dim at least 1 "
                         "(e.g. 4096x14336x4096, or 8x512x512x64 for a batch of 8)", problem=text)
    m, n, k, batch = dims
    return m, n, k, batch or 1


def resolve_gpu(cache: Cache, gpu: str | None, sms: int | None, arch: str) -> dict[str, Any]:
    """The GPU to explain for: one of the cache's tables (by a piece of its
    name, or the only one), or, with ``sms``, the model alone on ``arch``."""
    gpus = [rec["gpu"] for rec in cache.tables.values()]
    listed = ", ".join(sorted(f"{g['name']} ({g['sm_count']} SMs)" for g in gpus)) or "none"
    if sms is not None:
        try:
            parse_arch(arch)
        except ValueError as exc:
            raise UsageError(f"--arch: {exc}", arch=arch) from None
        if gpu is not None:
            raise UsageError("give --gpu (a GPU the cache has a selection table for) or --sms (the "
                             "model alone), not both")
        return {"name": None, "sm_count": sms, "capability": None, "arch": arch, "table": False}
    if gpu is None:
        if len(gpus) != 1:
            raise UsageError(f"name the GPU: --gpu NAME picks one of the cache's selection tables "
                             f"({listed}); --sms N explains the model alone", tables=listed)
        chosen = gpus[0]
    else:
        found = [g for g in gpus if gpu.lower() in g["name"].lower()]
        if len(found) != 1:
            fix = ("name one of those" if not found else
                   f"{len(found)} match: give more of the name")
            raise UsageError(f"--gpu {gpu!r}: the cache's selection tables are for {listed}; {fix}, "
                             "or give --sms N for the model alone", gpu=gpu)
        chosen = found[0]
    major, _, minor = str(chosen["capability"]).partition(".")
    try:
        cc = (int(major), int(minor))
    except ValueError:
        raise UsageError(f"the cache's table for {chosen['name']} names compute capability "
                         f"{chosen['capability']!r}, not MAJOR.MINOR: run `cutlass-aot verify`") from None
    return {"name": chosen["name"], "sm_count": int(chosen["sm_count"]),
            "capability": chosen["capability"], "arch": ARCH_BY_CAPABILITY.get(cc, f"sm_{major}{minor}"),
            "table": True}


def _call(m: int, n: int, k: int, batch: int, dtype: str, out_dtype: str, b_major: str,
          bias: str | None, with_c: bool) -> tuple[dict, dict, dict]:
    """dtypes, shapes and strides of contiguous operands, as select.call_signature takes them."""
    lead = (batch,) if batch > 1 else ()

    def rows(r: int, c: int) -> tuple[tuple, tuple]:  # row-major [.., r, c]
        return (*lead, r, c), ((r * c,) if lead else ()) + (c, 1)

    shapes, strides = {}, {}
    shapes["a"], strides["a"] = rows(m, k)
    if b_major == "k":  # w.t() of a row-major weight [.., n, k]
        shapes["b"], strides["b"] = (*lead, k, n), ((n * k,) if lead else ()) + (1, k)
    else:
        shapes["b"], strides["b"] = rows(k, n)
    shapes["out"], strides["out"] = rows(m, n)
    dtypes = {"a": dtype, "b": dtype, "out": out_dtype}
    if with_c:
        shapes["c"], strides["c"], dtypes["c"] = shapes["out"], strides["out"], out_dtype
    if bias is not None:
        shapes["bias"], strides["bias"], dtypes["bias"] = (n,), (1,), bias
    return dtypes, shapes, strides


def explain(cache_dir: str | os.PathLike, problems: list[tuple[int, int, int, int]], *,
            dtype: str = "bf16", out_dtype: str | None = None, b_major: str = "k",
            bias: str | None = None, act: str = "none", with_c: bool = False,
            gpu: str | None = None, sms: int | None = None, arch: str = "sm_90a",
            top: int = 5) -> dict[str, Any]:
    """What dispatch runs for each problem (module docstring), as a report."""
    if dtype not in DTYPES or (out_dtype or dtype) not in OUT_DTYPES or b_major not in ("k", "n") \
            or (bias is not None and bias not in BIAS_DTYPES) or act not in GEMM_ACTS or top < 0:
        raise UsageError(f"explain: dtype one of {DTYPES}, out dtype one of {OUT_DTYPES}, b major k "
                         f"or n, bias one of {BIAS_DTYPES}, act one of {GEMM_ACTS}, top >= 0")
    out_dtype = out_dtype or dtype
    cache = Cache(cache_dir)
    target = resolve_gpu(cache, gpu, sms, arch)
    report: dict[str, Any] = {"gpu": target, "problems": []}
    if target["table"]:
        report["table_status"] = cache.table_status(target["name"], target["sm_count"],
                                                    target["capability"])
    device_archs = runnable_archs(target["arch"])
    for m, n, k, batch in problems:
        dtypes, shapes, strides = _call(m, n, k, batch, dtype, out_dtype, b_major, bias, with_c)
        call_sig = select.call_signature(target["arch"], dtypes, shapes, strides, act)
        sig = next((s for s in select.signature_order(call_sig, 16, device_archs)
                    if select.gemm_entries(cache.by_signature.get(s, ()))), None)
        if sig is None:
            raise cache.arch_not_found(call_sig, target["arch"]) or cache.not_found(call_sig)
        spans = {name: batch * shape[-2] * shape[-1] for name, shape in shapes.items()
                 if name != "bias"}
        cands = select.entry_candidates(cache.by_signature[sig])
        if sig.arch != target["arch"]:  # as dispatch: a build checked its own arch's capacity
            cands = select.fits_device(cands, target["arch"], _BYTES[dtype])
        cands = select.within_index_limit(cands, spans)
        if not cands:
            raise KernelNotFoundError(
                f"no variant of {sig.text()} can run {m}x{n}x{k}x{batch} on {target['arch']}: each "
                "needs more shared memory than the GPU has, or indexes an operand past 2**31 "
                "elements in 32 bits", signature=sig.text())
        rows = (cache.table_rows(sig, target["name"], target["sm_count"], target["capability"])
                if target["table"] else None)
        choice = select.choose(cands, m, n, k, batch, target["sm_count"], rows, _BYTES[dtype],
                               _BYTES[out_dtype])
        row = (rows or {}).get((m, n, k, batch)) if choice.source == "table" else None
        ranked = select.ranked_choices(cands, m, n, k, batch, target["sm_count"], _BYTES[dtype],
                                       _BYTES[out_dtype])
        report["problems"].append({
            "m": m, "n": n, "k": k, "l": batch, "signature": sig.text(),
            "runs": choice.label(), "splits": choice.splits, "source": choice.source,
            "runner_up": row[2] if row and len(row) > 2 else None,
            "margin": row[3] if row and len(row) > 3 else None,
            "model": [{"label": ch.label(), "estimate_us": round(est, 2)} for est, ch in ranked[:top]],
            # the model's long-K order (select.LONGK_*) ranks the 1x2 256-row walks first
            "longk_order": select.longk_applies(m, n, k, batch),
        })
    return report


_SOURCE_TEXT = {"table": "the table's row for this problem",
                "table-below": "a table row at a smaller M, at this N and K, whose tiles cover this M",
                "model": "the model (no table row covers this problem)"}


def render_text(report: dict[str, Any]) -> str:
    """The report as a person reads it."""
    g = report["gpu"]
    if g["table"]:
        st = report.get("table_status") or {}
        head = (f"{g['name']} ({g['sm_count']} SMs, {g['arch']}); selection table "
                f"{st.get('table') or 'none'}" + (f" ({st['used']} rows bind)" if "used" in st else "")
                + (f": {st['reason']}" if st.get("reason") else ""))
    else:
        head = f"{g['sm_count']} SMs, {g['arch']}: the model alone (no table)"
    lines = [head]
    for p in report["problems"]:
        lines.append(f"{p['m']}x{p['n']}x{p['k']}" + (f"x{p['l']}" if p["l"] > 1 else "")
                     + f"  {p['signature']}")
        extra = ""
        if p["runner_up"]:
            extra = f"; measured next: {p['runner_up']}" + (
                f", {p['margin']:.3f}x" if p["margin"] is not None else "")
        lines.append(f"  runs {p['runs']}: {_SOURCE_TEXT.get(p['source'], p['source'])}{extra}")
        if p["model"]:
            lines.append("  the model's first" + (
                " (its long-K order puts the 1x2 256-row walks first, whatever their estimate)"
                if p["longk_order"] else "") + ": " + "; ".join(
                f"{o['label']} {o['estimate_us']:.1f} us" for o in p["model"]))
    lines.append("(contiguous, 16-byte aligned operands; other strides, lower alignment, an "
                 "odd-edge out or autotune can run something else: GemmRunner.choice_for on the GPU)")
    return "\n".join(lines)
