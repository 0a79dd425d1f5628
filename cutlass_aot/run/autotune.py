"""Autotune: on a call's first use, time the model's leading options and keep the fastest.

Run side: the standard library and torch only. Opt-in: CUTLASS_AOT_AUTOTUNE
(knobs.autotune_count) or ``GemmRunner.set_autotune``.

Why: the selection table answers the problems it was measured on, and the
model ranks every other problem from a handful of fitted constants. On
shapes nobody measured, the model's first choice is a few percent slower
than the best variant the cache holds, and sometimes far slower (issue 9:
worst regret 1.41 on a held-out sample). The fastest option is almost
always among the model's first few, so timing those few once, on the GPU
that serves the call, closes most of that gap. Replayed on the recorded
held-out timings, the best of the model's 6 leading options has a worst
regret of 1.20 and a 90th percentile of 1.04, against 2.44 and 1.20 for
the model's first option alone.

What it costs and what it changes:

* Once per dispatch key (shape and layout), at resolution: each option runs
  once to warm up, then ``ROUNDS`` interleaved rounds of a few back-to-back
  launches between CUDA events on the current stream, and the host waits
  for them. The whole sweep is bounded by about ``count x (1 + ROUNDS x
  reps)`` calls of the problem; the hot path afterwards is unchanged.
* What is timed is device time. A small GEMM runs faster than the host can
  launch it, so launches timed as they are issued would measure the host and
  rank every option alike. Each round therefore starts with a spin kernel
  (torch.cuda._sleep) long enough for the host to queue the whole round
  behind it; the GPU then runs the queued launches back to back, as it
  would replay them from a CUDA graph.
* The timing runs write into ``out`` (the call overwrites it next), or into
  scratch of out's layout when ``c`` shares out's memory (an in-place
  residual must not be read after a timing run wrote it).
* Not under CUDA graph capture (a capture cannot wait on events): there the
  model's or table's choice stands. Nor for calls below 16-byte alignment,
  whose route (staged or low-alignment) dispatch chooses by its own model. Warm up before capturing, as graphs
  require anyway, and the warm-up call is the one that tunes.
* Nor where the model's choice is the long-K order's walk
  (``select.autotune_defers``): a burst ranks heavy long-K options as they
  do not run under the power cap (r53, r55).
* Options differ in reduction order (split-K, tiles), so two processes may
  pick different variants for one shape and their results may differ in the
  last bits. Each process is deterministic once it has chosen. Leave it off
  where bitwise reproducibility across processes matters.

The design follows Triton's and FlashInfer's autotuners (time candidate
configurations on first use, cache the winner per key); unlike them it
never compiles: every option is an artifact already in the cache.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch

from . import select

# Interleaved timing rounds per option, and the time one round aims for.
ROUNDS = 3
ROUND_US = 60.0
MAX_REPS = 20
# Host time to queue one launch (generous: a split-K launch allocates its
# scratch), and the spin kernel's clock rate assumed to turn it into cycles
# (a slower clock only spins longer).
QUEUE_US_PER_LAUNCH = 15.0
SPIN_CYCLES_PER_US = 2000


def leading_options(cands: Sequence[select.Candidate], m: int, n: int, k: int, batch: int, sms: int,
                    count: int, in_bytes: int = 2, out_bytes: int = 2,
                    first: select.Choice | None = None) -> list[tuple[select.Choice, float]]:
    """The model's ``count`` fastest (choice, estimated µs), in select.ranked_choices' order.

    ``first`` (the table's or model's choice) is always among them, first.
    """
    ranked = select.ranked_choices(cands, m, n, k, batch, sms, in_bytes, out_bytes, "autotune")
    out: list[tuple[select.Choice, float]] = []
    if first is not None:
        est = select.estimate_us(first.candidate, first.splits, m, n, k, batch, sms, in_bytes,
                                 out_bytes)
        out.append((first, est))
    for est, ch in ranked:
        if len(out) >= count:
            break
        if first is not None and (ch.candidate, ch.splits) == (first.candidate, first.splits):
            continue
        out.append((ch, est))
    return out


def fastest(runs: Sequence[Callable[[], object]], est_us: Sequence[float],
            device: int | None = None) -> tuple[int, list[float]]:
    """(index of the fastest, median µs per call of each) for launch closures.

    Each closure launches one option on ``device``'s current stream (the
    tensors' GPU: dispatch launches there whatever the current device is);
    events and the spin kernel go to that stream too. The estimates only
    size the repetitions (about ``ROUND_US`` of work per round).
    """
    with torch.cuda.device(device):
        for run in runs:  # warm-up: first launches, lazy loads, allocator growth
            run()
        stream = torch.cuda.current_stream()
        reps = [max(1, min(MAX_REPS, math.ceil(ROUND_US / max(e, 1.0)))) for e in est_us]
        spin = getattr(torch.cuda, "_sleep", None)
        spin_cycles = int(QUEUE_US_PER_LAUNCH * (sum(reps) + 2 * len(runs)) * SPIN_CYCLES_PER_US)
        events = []
        for _ in range(ROUNDS):
            if spin is not None:  # hold the GPU while the host queues this round
                spin(spin_cycles)
            for run, r in zip(runs, reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                for _ in range(r):
                    run()
                end.record(stream)
                events.append((start, end))
        events[-1][1].synchronize()
    per: list[list[float]] = [[] for _ in runs]
    for i, (start, end) in enumerate(events):
        j = i % len(runs)
        per[j].append(start.elapsed_time(end) * 1e3 / reps[j])
    times = [statistics.median(x) for x in per]
    return min(range(len(runs)), key=times.__getitem__), times


__all__ = ["MAX_REPS", "QUEUE_US_PER_LAUNCH", "ROUNDS", "ROUND_US", "SPIN_CYCLES_PER_US", "fastest",
           "leading_options"]
