"""Tune: measure the candidates of each signature on this GPU, publish the winners.

Uses both sides: the run side to load and launch (run/dispatch.py, exactly
what services call), the store to publish the table like an artifact. Needs
a CUDA GPU and a writable cache.

For each problem of the shape set: build fresh random operands in the
problem's call layout (with a residual C, ``with_c``, since r64: the
with-C signatures had no rows, and the model alone chose among their
variants), time every (variant, split count) option of its
signature (``tune.timing`` rules: cold L2, median of repetitions; above
``MAX_OPTIONS`` options, the model's best ``MAX_OPTIONS``), re-time up to
``LEADERS`` leaders (the fastest option of distinct variants) interleaved
when they are within ``CLOSE`` of the fastest (more rounds for problems
under ``SHORT_US``; more leaders, a wider window and more rounds for
problems of ``LONG_US`` and more), and keep the fastest with its margin
over the runner-up.

Incremental and resumable: problems the cache's table for this GPU already
has are kept, unless ``force``, or the table was measured under another L2
policy (its rows are then re-measured, never mixed in), or the signature's
candidates changed since the row was measured (a row records a digest of the
candidate set it chose from, ``candidates``: a variant added to the manifest
may beat its winner; a row without the digest is re-measured, failing
closed); each finished problem is appended to a
journal under the cache's ``tmp/``, so a killed tune resumes where it
stopped; the table is published (merged with the old rows) at the end, or
when the time budget runs out, and the journal is then removed.

Steady state (``steady_ms``, ``DEFAULT_STEADY_MS`` unless asked otherwise;
0 turns it off): a problem whose fastest
option takes ``timing.STEADY_MIN_US`` or more in the screen has its leaders
(with, at long K, the walks the model's long-K order prefers, and at least a
runner-up) re-timed interleaved, each timing after ``steady_ms`` of GPU time
back to back, and its row is chosen among them: the table then ranks heavy
calls at the clock the GPU's power cap holds under sustained load, not in a
burst above it (r53: at long K the two regimes order the walks
differently). Such a row records its ``steady_ms``; the table's ``timing``
says which rows have one. At long K (``select.longk_rank``) the long-K
walks are always among the options screened, steady or not.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .. import __version__, tables
from ..builder.store import CacheStore
from ..errors import KernelNotFoundError, UsageError
from ..layout import TMP_DIR, table_slot
from ..run import select
from ..run.dispatch import GemmRunner, device_info, launch_choice
from ..run.load import Cache
from ..signature import gemm_signature
from .shapes import Problem
from .timing import (
    L2_POLICY,
    STEADY_MIN_US,
    TORCH_DTYPES,
    cold_operands,
    interleaved,
    steady_for,
    time_us,
)

MAX_OPTIONS = 48
# ... plus, for each kernel form (tile, swap-AB, K-cluster, split-K,
# pingpong, gemv) the model's first MAX_OPTIONS leave out, that form's
# best-estimated option when its estimate is within FORM_WINDOW of the best
# estimate. The model is least sure of the forms it was fitted on least: r26
# found the unswapped 128x64 K-cluster at 128x4096x14336 running 35.7 µs,
# the fastest option in the cache, while the model put it 190th (62.0 µs
# estimated), so a tune of the top 48 never timed it and kept a 40.8 µs
# split-K option. A form's other clusters, rasters and split counts follow
# the model's order.
FORM_WINDOW = 2.0
# Leaders re-timed interleaved: options within CLOSE of the fastest single
# timing, at most LEADERS of them. A first timing can be off by several
# percent (clock state, operand addresses): with a 3% window, r11's re-tune
# kept f16 1x4096x4096's 128x16/kc2 at 11.6 µs over gemv1x4's 10.6-10.8.
CLOSE = 0.10
LEADERS = 4
# Problems whose fastest option is under SHORT_US get more interleaved
# rounds: a repetition of them spans many launches, and a few-µs kernel's
# ratio moves most with clock drift.
SHORT_US = 20.0
# Problems whose fastest option takes LONG_US or more re-time up to
# LEADERS_LONG leaders within CLOSE_LONG, over 5 rounds. A repetition of a
# multi-millisecond call is one launch, and the H200's clocks swing under
# such calls for longer than a repetition: r37's gelu_pack_ab timed one
# 128x256/2x1 schedule at 16384x4096x14336 at 3,650 µs with a bias and 2,993
# with bias+GELU, interleaved; the table's bf16 bias+GELU row there kept
# 128x256/1x1 (2,837 µs in its tune) with 128x256/2x1/n8 1.101x behind,
# where bench_epilogue ran them at 3,079 and 2,897 (the plain pick).
LONG_US = 1000.0
CLOSE_LONG = 0.20
LEADERS_LONG = 6


def _journal(root: Path, gpu: dict) -> Path:
    # The L2 policy is in the tag: a journal left by a tune under another
    # policy is not resumed into this one.
    tag = hashlib.sha256(f"{table_slot(gpu)}|l2={L2_POLICY}".encode()).hexdigest()[:12]
    return root / TMP_DIR / f"tune-journal-{tag}.jsonl"


def policy_rows(doc: dict | None) -> list[dict]:
    """A published table's rows if it was timed under this L2 policy, else
    none: rows timed under other rules are measured again, never mixed in
    (a table without a readable ``timing.l2`` counts as another policy)."""
    timing = doc.get("timing") if isinstance(doc, dict) else None
    if not isinstance(timing, dict) or timing.get("l2") != L2_POLICY:
        return []
    return list(doc["rows"])


# Heavy problems are ranked at the power cap's clock unless the caller asks for
# bursts (steady_ms=0, the default until r73). A service runs its heavy GEMMs
# back to back (a prefill's layers), and twice a burst's winner lost there: at
# long K (r52-r53, an H100: 28.2 ms in the sweep, 40-42 sustained) and at the
# Llama's MLP widths (r73: the burst-tuned down_proj row ran 1,451 µs a launch
# in the model's forward against cuBLAS's 1,219; the steady row, 1,214). The
# cost: up to 8 options x 5 rounds x this many ms of back-to-back runs on each
# problem of 1 ms or more (about 12 s); lighter problems are timed as before.
DEFAULT_STEADY_MS = 300.0


def tune(cache_dir: Path, problems: list[Problem], *, budget_s: float | None = None,
         force: bool = False, progress: bool = False,
         steady_ms: float = DEFAULT_STEADY_MS) -> dict[str, Any]:
    """Measure ``problems`` on GPU 0 and publish the table; returns a report.
    ``steady_ms``: see the module docstring and ``DEFAULT_STEADY_MS`` (0:
    burst timing, the default before r73)."""
    if not (steady_ms >= 0 and math.isfinite(steady_ms)):
        raise UsageError(f"steady_ms must be a finite number of ms, 0 or more; got {steady_ms}",
                         steady_ms=steady_ms)
    if not torch.cuda.is_available():
        raise UsageError("cutlass-aot tune measures kernels on a CUDA GPU, and this machine "
                         "has none: run it on the GPU you deploy to (the table is bound to it)")
    cache = Cache(cache_dir)
    store = CacheStore(cache.path)
    store.ensure()
    arch, sms, name, cc = device_info(0)
    gpu = tables.gpu_identity(name, sms, cc)
    # Rows measured on a variant the cache no longer has, or on an older
    # kernel source, are re-measured: only rows that still bind are "had".
    entries = tables.entries_of((e.record, e.signature.text()) for e in cache.entries.values())
    old_rows = tables.binding_rows(policy_rows(store.table_doc(gpu)), entries)
    have = {tables.row_identity(r): r.get("candidates") for r in old_rows}
    journal = _journal(cache.path, gpu)
    resumed: list[dict] = []
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                row = json.loads(line)
                if tables._row_problem(row) is None:
                    resumed.append(row)
            except ValueError:
                continue  # a line cut by a kill
    done = {tables.row_identity(r) for r in resumed}
    runner = GemmRunner(cache)
    start = time.monotonic()
    report: dict[str, Any] = {"gpu": gpu, "measured": 0, "kept": 0, "resumed": len(resumed),
                              "skipped": [], "rows": [], "retimed": [], "stopped_by_budget": False}
    new_rows = list(resumed)
    with journal.open("a") as jf:
        for i, prob in enumerate(problems):
            a_dt, b_dt, d_dt, a_major, b_major, d_major, rank = prob.layout
            sig = gemm_signature(arch, a=a_dt, b=b_dt, d=d_dt, c=prob.c, a_major=a_major,
                                 b_major=b_major, d_major=d_major, rank=rank, bias=prob.bias,
                                 act=prob.act)
            ident = (sig.text(), *prob.dims)
            if ident in done:
                continue  # resumed, or met before in this run (sources may repeat a problem)
            done.add(ident)
            try:
                cands = runner._candidates_for(sig)
            except KernelNotFoundError:
                report["skipped"].append({"signature": sig.text(), "reason": "no variant in cache"})
                continue
            # As dispatch serves it (GemmRunner._indexable): a variant whose
            # 32-bit layout offsets cannot reach the tune's contiguous
            # operands is never timed (it would read wrong memory or fault).
            m, n, k, batch = prob.dims
            spans = {"a": batch * m * k, "b": batch * k * n, "out": batch * m * n}
            cands = select.within_index_limit(
                cands, spans | ({"c": batch * m * n} if prob.c is not None else {}))
            options = tune_options(cands, m, n, k, batch, sms)
            if not options:
                report["skipped"].append({"signature": sig.text(), "dims": list(prob.dims),
                                          "reason": "no variant can run this problem (operands past "
                                                    "2**31 elements, or clusters larger than the GPU)"})
                continue
            if ident in have and not force and have[ident] == candidates_digest(cands):
                report["kept"] += 1
                continue
            if budget_s is not None and time.monotonic() - start > budget_s:
                report["stopped_by_budget"] = True
                break
            row, retimed = _measure(cache, cands, options, sig, prob, sms, steady_ms)
            if retimed:
                report["retimed"].append({"signature": row["signature"], "m": row["m"],
                                          "n": row["n"], "k": row["k"], "l": row["l"],
                                          "steady_ms": row.get("steady_ms", 0.0),
                                          "options": retimed})
            jf.write(json.dumps(row, sort_keys=True) + "\n")
            jf.flush()
            new_rows.append(row)
            report["measured"] += 1
            if progress:
                print(f"\rtune {i + 1}/{len(problems)} {sig.text()[:40]} "
                      f"{prob.m}x{prob.n}x{prob.k}: {row['label']} {row['us']:.1f} µs",
                      end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    rows = tables.merge_rows(old_rows, new_rows)
    doc = {"format": tables.TABLE_FORMAT, "version": tables.TABLE_VERSION, "gpu": gpu,
           "measured_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
           "tool": f"cutlass-aot {__version__}",
           "timing": {"l2": L2_POLICY, "clock": "device time (CUDA graph replay)",
                      "stat": "median of 5 repetitions of >=300 us; up to "
                      f"{LEADERS} leaders (distinct variants) within {CLOSE:.0%} re-timed "
                      f"interleaved (3 rounds, 5 under {SHORT_US:g} us; from {LONG_US:g} us up "
                      f"to {LEADERS_LONG} within {CLOSE_LONG:.0%}, 5 rounds)",
                      "steady": f"rows with steady_ms: the fastest option took {STEADY_MIN_US:g} us "
                      "or more, and the leaders were re-timed each after that many ms back to "
                      "back (the power cap's clock), the row chosen among them; rows without: "
                      "bursts after a pause"},
           "rows": rows}
    report["table"] = store.publish_table(doc)
    report["rows"] = new_rows
    report["total_rows"] = len(rows)
    journal.unlink(missing_ok=True)
    return report


def candidates_digest(cands: list[select.Candidate]) -> str:
    """A digest of the schedules a row chose among (order-free): a row is
    current only while its signature offers exactly these."""
    text = "\n".join(sorted(c.label() for c in cands))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def leaders(times: list[float], variants: list | None = None) -> list[int]:
    """Indices of the options to re-time interleaved: within CLOSE of the
    fastest first timing, fastest first, at most LEADERS (CLOSE_LONG and
    LEADERS_LONG when the fastest takes LONG_US or more).

    ``variants`` names each option's variant: the leaders are then the
    fastest option of distinct variants. A split-K variant offers a dozen
    split counts of nearly one speed, which otherwise fill the leaders by
    themselves: r38's bias rows kept 128x256/2x1 split 2 ways at
    4096x4096x14336 and split 4 ways at 4096x28672x4096 (f16), where
    benchmarks/harness_ab.py timed the unsplit tile 7% and 6% faster in the
    same harness."""
    order = sorted(range(len(times)), key=times.__getitem__)
    long = times[order[0]] >= LONG_US
    close, most = (CLOSE_LONG, LEADERS_LONG) if long else (CLOSE, LEADERS)
    out, seen = [], set()
    for i in order:
        if len(out) == most or times[i] > times[order[0]] * (1 + close):
            break
        v = i if variants is None else variants[i]
        if v not in seen:
            seen.add(v)
            out.append(i)
    return out


def retime_set(times: list[float], variants: list, walks: list[int], heavy: bool) -> list[int]:
    """The options re-timed interleaved after the screen: the leaders; for a
    heavy problem timed steady (module docstring) also the long-K ``walks``,
    wherever the burst screen put them, and a runner-up of another variant
    where the leaders are one."""
    lead = leaders(times, variants)
    if heavy:
        lead += [i for i in walks if i not in lead]
        if len(lead) < 2:
            lead += [i for i in sorted(range(len(times)), key=times.__getitem__)
                     if variants[i] != variants[lead[0]]][:1]
    return lead


def retimed_options(labels: list[str], times: list[float], order: list[int],
                    lead: list[int]) -> list[list]:
    """The re-timed options ``lead``, [label, µs] in ``ranking``'s order
    (fastest first)."""
    chosen = set(lead)
    return [[labels[i], round(times[i], 3)] for i in order if i in chosen]


def ranking(times: list[float], lead: list[int], heavy: bool) -> list[int]:
    """Option indices, fastest first, that a row's winner and runner-up come
    from: every option, or for a heavy problem timed steady only the re-timed
    ones (a burst figure and a steady one do not compare)."""
    return sorted(lead if heavy else range(len(times)), key=times.__getitem__)


def retime_rounds(times: list[float]) -> int:
    """Interleaved rounds for a problem: 5 when its fastest option is under
    SHORT_US or at least LONG_US, else 3."""
    fastest = min(times)
    return 5 if fastest < SHORT_US or fastest >= LONG_US else 3


def _form(c: select.Candidate) -> tuple:
    return (c.gemv, c.tile_m, c.tile_n, c.swap_ab, c.k_cluster, c.split_k, c.pingpong)


def tune_options(cands: list[select.Candidate], m: int, n: int, k: int, batch: int,
                 sms: int) -> list[select.Choice]:
    """The (variant, split) options a tune times for one problem: the model's
    first MAX_OPTIONS, then the best-estimated option of each form they
    leave out whose estimate is within FORM_WINDOW of the best (model order
    throughout), then, at long K, the long-K order's walks (select.longk_rank)
    where neither took them."""
    # select._options: split_choices' counts, or split-K-only signatures run
    # data-parallel where no split is worth making (as dispatch runs them)
    options = [select.Choice(c, s, "tune") for c, s in select._options(cands, m, n, k, batch, sms)]
    if len(options) <= MAX_OPTIONS:
        return options
    # the long-K order's walks, which the estimate puts behind the walks
    # that go DRAM-bound under sustained load, are timed too
    longk = _longk_walks(options, m, n, k, batch)
    est = [select.estimate_us(ch.candidate, ch.splits, m, n, k, batch, sms) for ch in options]
    order = sorted(range(len(options)), key=est.__getitem__)
    chosen = order[:MAX_OPTIONS]
    seen = {_form(options[i].candidate) for i in chosen}
    limit = est[order[0]] * FORM_WINDOW
    for i in order[MAX_OPTIONS:]:
        form = _form(options[i].candidate)
        if form not in seen and est[i] <= limit:
            seen.add(form)
            chosen.append(i)
    chosen += [i for i in longk if i not in chosen]
    return [options[i] for i in chosen]


def _longk_walks(options: list[select.Choice], m: int, n: int, k: int, batch: int) -> list[int]:
    """Indices of the options the model's long-K order prefers (select.longk_rank);
    none for a problem it does not rank."""
    return [i for i, ch in enumerate(options) if select.longk_walk(ch.candidate, m, n, k, batch)]


def _measure(cache: Cache, cands: list[select.Candidate], options: list[select.Choice], sig,
             prob: Problem, sms: int, steady_ms: float = 0.0) -> tuple[dict, list]:
    """Time ``options`` (tune_options of ``cands``) on one problem: its table
    row, and the options re-timed interleaved as [label, µs] fastest first
    (the report's ``retimed``: the margins a row's runner-up alone does not
    give, such as a long-K walk's against a steady winner; empty when none
    was)."""
    m, n, k, batch = prob.dims
    # (a, b, out), with a C after them for a residual problem
    sets = cold_operands(prob.layout, m, n, k, batch, with_c=prob.c is not None)
    # A bias vector per operand set, rotated with it.
    vecs = [None if prob.bias is None else
            torch.randn(n, device=ops[2].device).to(TORCH_DTYPES[prob.bias]) for ops in sets]
    # One launcher per operand set (a launcher binds its bias).
    fns = [[functools.partial(launch_choice(cache, ch, sms, m, n, batch, vec, k=k), *ops)
            for ops, vec in zip(sets, vecs)] for ch in options]
    # the screen: every option, a burst after a pause
    times = [time_us(f, graph=True) for f in fns]
    steady_ms = steady_for(steady_ms, min(times))  # 0: this problem is timed in bursts
    heavy = steady_ms > 0
    lead = retime_set(times, [ch.candidate.key for ch in options],
                      _longk_walks(options, m, n, k, batch), heavy)
    retime = len(lead) > 1 or heavy  # a single leader in a burst stands as screened
    if retime:
        # heavy: every re-timed option gets the warm-up, one timing just under
        # STEADY_MIN_US too (steady_min_us=0), so none is compared in a burst
        again = interleaved([fns[i] for i in lead], graph=True, rounds=retime_rounds(times),
                            steady_ms=steady_ms, steady_min_us=0.0)
        for i, t in zip(lead, again):
            times[i] = t
    order = ranking(times, lead, heavy)
    best = options[order[0]]
    runner_up = options[order[1]] if len(order) > 1 else None
    entry = cache.entries[best.candidate.key]
    steady = {"steady_ms": steady_ms} if heavy else {}  # a burst row has no field, as before r54
    retimed = retimed_options([ch.label() for ch in options], times, order, lead) if retime else []
    return {
        "signature": sig.text(), "family": entry.record["family"],
        # An entry from before kernel_sources was recorded binds to nothing.
        "kernel_sources": entry.record.get("kernel_sources") or "unrecorded",
        "artifact": entry.record["sha256"],  # the very file timed (tables.bind, tables.restamp)
        "m": m, "n": n, "k": k, "l": batch,
        "variant": best.candidate.variant_fields(), "splits": best.splits,
        "label": best.label(), "us": round(times[order[0]], 3),
        "runner_up": runner_up.label() if runner_up else None,
        "margin": round(times[order[1]] / times[order[0]], 4) if runner_up else None,
        "options": len(options),
        "candidates": candidates_digest(cands),
        **steady,
    }, retimed


def tune_env_ok() -> None:
    """Refuse a device env knob that would make measurements lie."""
    if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        raise UsageError("CUDA_LAUNCH_BLOCKING=1 serializes launches and skews every timing; "
                         "unset it for `cutlass-aot tune`")


__all__ = ["CLOSE_LONG", "FORM_WINDOW", "LEADERS_LONG", "LONG_US", "MAX_OPTIONS", "leaders", "retime_rounds", "tune", "tune_env_ok", "tune_options"]
