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

What it cannot see, and says so: a call with other strides; dims that put a
row off a 16-byte boundary (dispatch stages such a call or runs a
low-alignment variant: explain shows the 16-byte route and flags the
problem); an ``out`` whose rows end off a 16-byte boundary inside a padded
pitch (written through scratch); and autotune (a model pick timed against
the model's next options at the first call, except the long-K walk, which
it keeps: that much it says). For those, ask the runner on
the GPU (``GemmRunner.choice_for``). ``explain_logs`` does the same for the
problems a service's shape log recorded as served.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .archs import call_alignment, parse_arch, runnable_archs
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
    """(M, N, K, L) of ``MxNxK`` or ``MxNxKxL``, each at least 1; L > 1 is a
    batched (rank 3) call, L = 1 a plain one (rank 2)."""
    match = _PROBLEM.fullmatch(text.strip().lower())
    dims = None if match is None else [int(g) for g in match.groups(default="0")]
    if dims is None or min(dims[:3]) < 1 or (match.group(4) is not None and dims[3] < 1):
        raise UsageError(f"problem {text!r} is not MxNxK or MxNxKxL with every dim at least 1 "
                         "(e.g. 4096x14336x4096, or 512x512x64x8 for a batch of 8)", problem=text)
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
        got = _resolve(cache, target, sig, m, n, k, batch, top)
        # Contiguous operands of these dims, from 16-byte aligned allocations:
        # a row that ends off a 16-byte boundary makes the call a staged or
        # low-alignment one, which this explains by its 16-byte route only.
        got["alignment"] = call_alignment(
            (0, strides[name], _BYTES[dtypes[name]]) for name in ("a", "b", "out", "c")
            if name in shapes)
        report["problems"].append(got)
    return report


def _resolve(cache: Cache, target: dict, sig, m: int, n: int, k: int, batch: int,
             top: int) -> dict[str, Any]:
    """One problem of ``sig``'s contiguous operands on ``target``, as dispatch
    resolves it once it has the serving signature (module docstring)."""
    fields = dict(sig.fields)
    in_bytes, out_bytes = _BYTES.get(fields.get("a"), 2), _BYTES.get(fields.get("d"), 2)
    spans = {"a": batch * m * k, "b": batch * k * n, "out": batch * m * n}
    if fields.get("c") not in (None, "-"):
        spans["c"] = spans["out"]
    cands = select.entry_candidates(cache.by_signature.get(sig, ()))
    if not cands:
        raise cache.not_found(sig)
    if sig.arch != target["arch"]:  # as dispatch: a build checked its own arch's capacity
        cands = select.fits_device(cands, target["arch"], in_bytes)
    cands = select.within_index_limit(cands, spans)
    if not cands:
        raise KernelNotFoundError(
            f"no variant of {sig.text()} can run {m}x{n}x{k}x{batch} on {target['arch']}: each "
            "needs more shared memory than the GPU has, or indexes an operand past 2**31 "
            "elements in 32 bits", signature=sig.text())
    rows = (cache.table_rows(sig, target["name"], target["sm_count"], target["capability"])
            if target["table"] else None)
    choice = select.choose(cands, m, n, k, batch, target["sm_count"], rows, in_bytes, out_bytes,
                           above=select.row_above_serves(fields))
    row = (rows or {}).get((m, n, k, batch)) if choice.source == "table" else None
    # every option estimated and ordered: only for a report that lists them
    ranked = (select.ranked_choices(cands, m, n, k, batch, target["sm_count"], in_bytes, out_bytes)
              if top else [])
    return {
        "m": m, "n": n, "k": k, "l": batch, "signature": sig.text(),
        "runs": choice.label(), "splits": choice.splits, "source": choice.source,
        "runner_up": row[2] if row and len(row) > 2 else None,
        "margin": row[3] if row and len(row) > 3 else None,
        "model": [{"label": ch.label(), "estimate_us": round(est, 2)} for est, ch in ranked[:top]],
        # the model's long-K order (select.LONGK_*) ranks the 1x2 256-row walks first
        "longk_order": select.longk_applies(m, n, k, batch),
        # the model's long-K walk: autotune, where on, runs it untimed (r55)
        "autotune_keeps": choice.source == "model" and select.autotune_defers(choice, m, n, k, batch),
    }


def explain_logs(cache_dir: str | os.PathLike, paths: list[str], *, gpu: str | None = None,
                 sms: int | None = None, arch: str = "sm_90a") -> dict[str, Any]:
    """How the calls shape logs recorded as served (outcome ``hit``) are served
    now: per signature, the distinct problems a table row, a covering row
    below, or the model answers, and the model's, most met first: what
    ``cutlass-aot tune --from-log`` on the GPU would measure. A signature the
    cache no longer holds, or one of a low alignment (staged or native
    routes, which need the tensors), is listed apart."""
    from .shapelog import read_shape_logs  # noqa: PLC0415

    try:
        records, skipped = read_shape_logs(paths)
    except OSError as exc:
        raise UsageError(f"cannot read shape log {exc.filename}: {exc.strerror}; check the path",
                         path=str(exc.filename)) from None
    cache = Cache(cache_dir)
    target = resolve_gpu(cache, gpu, sms, arch)
    met: dict[tuple, int] = {}
    for rec in records:
        if rec.outcome == "hit":
            met[(rec.signature, rec.shape)] = met.get((rec.signature, rec.shape), 0) + 1
    by_sig: dict[str, dict[str, Any]] = {}
    unexplained: list[dict[str, Any]] = []
    runnable = runnable_archs(target["arch"])
    for (sig, (m, n, k, batch)), count in sorted(met.items(), key=lambda kv: (kv[0][0].text(), -kv[1])):
        why = None
        if sig.arch not in runnable:
            why = f"built for {sig.arch}, which {target['arch']} does not run"
        elif int(dict(sig.fields).get("align", 16)) != 16:
            why = "a low-alignment signature: its route (staged or native) needs the tensors"
        if why is None:
            try:
                got = _resolve(cache, target, sig, m, n, k, batch, 0)
            except KernelNotFoundError as exc:
                why = exc.message.splitlines()[0]
        if why is not None:
            unexplained.append({"signature": sig.text(), "m": m, "n": n, "k": k, "l": batch,
                                "records": count, "reason": why})
            continue
        entry = by_sig.setdefault(sig.text(), {"signature": sig.text(), "table": 0,
                                               "table-below": 0, "table-above": 0, "model": 0,
                                               "model_problems": []})
        entry[got["source"]] += 1
        if got["source"] == "model":
            entry["model_problems"].append({"m": m, "n": n, "k": k, "l": batch, "records": count,
                                            "runs": got["runs"]})
    report: dict[str, Any] = {"gpu": target, "logs": list(map(str, paths)),
                              "records": len(records), "skipped_lines": sum(skipped.values()),
                              "signatures": list(by_sig.values()), "unexplained": unexplained}
    if target["table"]:
        report["table_status"] = cache.table_status(target["name"], target["sm_count"],
                                                    target["capability"])
    return report


def render_logs_text(report: dict[str, Any]) -> str:
    """``explain_logs``' report as a person reads it."""
    lines = [_gpu_line(report), f"{_n(report['records'], 'log record')} "
             f"({_n(report['skipped_lines'], 'malformed line')} skipped)"]
    model = 0
    for e in report["signatures"]:
        model += e["model"]
        lines.append(f"{e['signature']}: {_n(e['table'], 'problem')} served by table rows, "
                     f"{e['table-below']} by a row below, {e.get('table-above', 0)} by a row above, "
                     f"{e['model']} by the model")
        for p in e["model_problems"][:5]:
            lines.append(f"  model: {p['m']}x{p['n']}x{p['k']}" + (f"x{p['l']}" if p["l"] > 1 else "")
                         + f" ({_n(p['records'], 'record')}) runs {p['runs']}")
        if len(e["model_problems"]) > 5:
            lines.append(f"  ... and {len(e['model_problems']) - 5} more")
    for u in report["unexplained"]:
        lines.append(f"not explained: {u['signature']} {u['m']}x{u['n']}x{u['k']}x{u['l']}: {u['reason']}")
    if model:
        lines.append(f"the model picks for {_n(model, 'problem')}: `cutlass-aot tune --from-log "
                     f"{' '.join(report['logs'])}` on this GPU measures them into the table")
    return "\n".join(lines)


_SOURCE_TEXT = {"table": "the table's row for this problem",
                "table-below": "a table row at a smaller M, at this N and K, whose tiles cover this M",
                "table-above": ("a table row at a larger M, at this N and K, whose tiles cover this M, "
                                f"within {select.ROW_ABOVE_BOUND}x of the row below"),
                "model": "the model (no table row covers this problem)"}


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _gpu_line(report: dict[str, Any]) -> str:
    g = report["gpu"]
    if not g["table"]:
        return f"{g['sm_count']} SMs, {g['arch']}: the model alone (no table)"
    st = report.get("table_status") or {}
    return (f"{g['name']} ({g['sm_count']} SMs, {g['arch']}); selection table "
            f"{st.get('table') or 'none'}" + (f" ({st['used']} rows bind)" if "used" in st else "")
            + (f": {st['reason']}" if st.get("reason") else ""))


def render_text(report: dict[str, Any]) -> str:
    """The report as a person reads it."""
    lines = [_gpu_line(report)]
    for p in report["problems"]:
        lines.append(f"{p['m']}x{p['n']}x{p['k']}" + (f"x{p['l']}" if p["l"] > 1 else "")
                     + f"  {p['signature']}")
        extra = ""
        if p["runner_up"]:
            extra = f"; measured next: {p['runner_up']}" + (
                f", {p['margin']:.3f}x" if p["margin"] is not None else "")
        if p.get("autotune_keeps"):
            extra += "; autotune, where on, keeps it untimed (the long-K walk)"
        lines.append(f"  runs {p['runs']}: {_SOURCE_TEXT.get(p['source'], p['source'])}{extra}")
        if p.get("alignment", 16) < 16:
            lines.append(f"  note: these dims leave rows {p['alignment']}-byte aligned, not 16: "
                         "dispatch stages the call (copies into 16-byte pitched scratch) onto this "
                         "option, or runs a low-alignment variant where the cache has one and the "
                         "model prefers it")
        if p["model"]:
            lines.append("  the model's first" + (
                " (its long-K order puts the 1x2 256-row walks first, on the side where the band "
                "takes fewer waves, the shorter side on a tie, whatever their estimate)"
                if p["longk_order"] else "") + ": " + "; ".join(
                f"{o['label']} {o['estimate_us']:.1f} us" for o in p["model"]))
    lines.append("(contiguous, 16-byte aligned operands; other strides, lower alignment, an "
                 "odd-edge out or autotune can run something else: GemmRunner.choice_for on the GPU)")
    return "\n".join(lines)
