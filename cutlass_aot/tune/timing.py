"""GPU timing for tune and the benchmarks: one harness, one set of rules.

Imports torch. Rules (stated in every table that uses them):

* warm L2: operands stay resident between repetitions, as in a service
  that calls the same layer back to back; the first calls warm up
  (clocks, caches, lazy loads) and are not timed;
* each repetition times ``iters`` back-to-back launches with CUDA events,
  ``iters`` chosen so a repetition lasts about ``rep_us``; the result is the
  median over repetitions, in µs per call;
* close calls are re-timed interleaved: ``interleaved`` times a few
  functions round-robin so clock drift hits all of them alike;
* ``graph=True`` (what tune and the benchmarks use) captures the ``iters``
  calls in a CUDA graph and times its replays: device time, free of the
  host's launch cost, which services under CUDA graphs do not pay and eager
  services pay once per call whatever the kernel (benchmarks/bench_host.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def time_us(fn: Callable[[], object], *, reps: int = 5, rep_us: float = 300.0,
            warmup: int = 2, max_iters: int = 200, graph: bool = False) -> float:
    """Median µs per call of ``fn`` (see the module docstring)."""
    for _ in range(warmup):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e) * 1e3, 1.0)
    iters = max(1, min(max_iters, int(rep_us / one)))
    run = None
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        run = g.replay
    times = []
    for _ in range(reps):
        s.record()
        if run is not None:
            run()
        else:
            for _ in range(iters):
                fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / iters)
    return statistics.median(times)


def interleaved(fns: Sequence[Callable[[], object]], *, rounds: int = 3, reps: int = 3,
                rep_us: float = 300.0, graph: bool = False) -> list[float]:
    """Median µs per call of each function, timed round-robin over ``rounds``."""
    per: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            per[i].append(time_us(fn, reps=reps, rep_us=rep_us, warmup=1, graph=graph))
    return [statistics.median(x) for x in per]


TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def operands(layout: tuple, m: int, n: int, k: int, batch: int, device="cuda"):
    """Fresh random a, b, out for a call layout (a, b, d, a_major, b_major, d_major, rank)."""
    dts = TORCH_DTYPES
    a_dt, b_dt, d_dt, a_major, b_major, d_major, rank = layout
    lead = (batch,) if rank == 3 else ()

    def mat(rows, cols, dt, last_contiguous):
        if last_contiguous:
            return torch.randn((*lead, rows, cols), device=device, dtype=dts[dt])
        return torch.randn((*lead, cols, rows), device=device, dtype=dts[dt]).transpose(-1, -2)

    a = mat(m, k, a_dt, a_major == "k")
    b = mat(k, n, b_dt, b_major == "n")
    if d_major == "n":
        out = torch.empty((*lead, m, n), device=device, dtype=dts[d_dt])
    else:
        out = torch.empty((*lead, n, m), device=device, dtype=dts[d_dt]).transpose(-1, -2)
    return a, b, out


__all__ = ["TORCH_DTYPES", "interleaved", "operands", "time_us"]
