"""GPU timing for tune and the benchmarks: one harness, one set of rules.

Imports torch. Rules (stated in every table that uses them):

* cold L2 (``L2_POLICY``): each call reads operands that no call touched
  in the last two L2-fulls of traffic, as a layer of a model finds its
  weights (every other layer's weights passed through the L2 since its last
  call). The caller builds ``copies_for`` sets of operands (``cold_operands``)
  and hands ``time_us`` one function per set; consecutive calls rotate
  through them. Until 2026-11-30 the operands stayed warm in L2 between
  calls, which let a problem whose operands fit the H200's L2 (60 MiB) run
  faster than HBM allows, and made those timings swing from process to
  process. The first calls warm up (clocks, lazy loads) and are not timed;
* each repetition times ``iters`` back-to-back launches with CUDA events,
  ``iters`` chosen so a repetition lasts about ``rep_us``; the result is the
  median over repetitions, in µs per call;
* close calls are re-timed interleaved: ``interleaved`` times a few
  functions round-robin so clock drift hits all of them alike, in reverse
  order every other round (``round_order``): on multi-millisecond
  compute-bound calls the function timed right after another runs 1.3-1.5%
  slower whichever it is (r23, benchmarks/results/
  2026-12-02_h200_r23_pdl_ab_long_reversed.md), so a fixed order favoured
  the first;
* ``steady_ms`` (off unless asked): a call of at least ``STEADY_MIN_US``
  first runs back to back for that many ms of GPU time, so the timed
  repetitions find the GPU at the clock its power cap holds under sustained
  load. A burst of a few heavy calls after a pause runs above that clock:
  r53 (benchmarks/results/2026-12-05_h100_r53_notes.md, H100, 700 W cap)
  saw the same long-K option at 28.2 ms in a sweep and 40-42 ms sustained,
  and the options that read the most DRAM lose the most;
* ``graph=True`` (what tune and the benchmarks use) captures the ``iters``
  calls in a CUDA graph and times its replays: device time, free of the
  host's launch cost, which services under CUDA graphs do not pay and eager
  services pay once per call whatever the kernel (benchmarks/bench_host.py).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence

import torch

L2_POLICY = "cold"
# Operand sets rotated at most: a problem of a few KB stays partly warm
# (its sets together are smaller than the L2); stated where it matters.
MAX_COPIES = 512
# Calls this long or longer take ``steady_ms``'s warm-up; shorter ones stay
# far from the power cap's clock in any burst a harness runs.
STEADY_MIN_US = 1000.0

Fn = Callable[[], object]


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """Operand sets to rotate through so every call finds its operands cold.

    Between two uses of one set the other sets move at least twice the L2's
    bytes. A problem that moves that much on its own evicts its own operands
    and needs one set.
    """
    if nbytes <= 0 or nbytes >= 2 * l2_bytes:
        return 1
    return min(MAX_COPIES, 1 + -(-2 * l2_bytes // nbytes))


def l2_bytes(device: int = 0) -> int:
    """The GPU's L2 size in bytes."""
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def time_us(fn: Fn | Sequence[Fn], *, reps: int = 5, rep_us: float = 300.0,
            warmup: int = 2, max_iters: int = 200, graph: bool = False,
            steady_ms: float = 0.0, steady_min_us: float = STEADY_MIN_US) -> float:
    """Median µs per call (see the module docstring).

    ``fn`` is one function, or one per operand set: call i runs
    ``fn[i % len(fn)]``, and each repetition makes at least one pass over
    all of them, so the sets' rotation holds inside a repetition.
    ``steady_min_us``: the shortest call ``steady_ms`` applies to; a caller
    that has decided a whole problem is heavy passes 0, so every function it
    compares gets the warm-up, even one that times just under the bar.
    """
    if steady_ms < 0 or steady_min_us < 0:
        raise ValueError(f"steady_ms and steady_min_us must be 0 or more, not {steady_ms} and "
                         f"{steady_min_us}")
    fns = list(fn) if isinstance(fn, Sequence) else [fn]
    for i in range(max(warmup, len(fns))):
        fns[i % len(fns)]()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fns[0]()
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e) * 1e3, 1.0)
    if steady_ms and one >= steady_min_us:
        _run_for(fns, steady_ms * 1e3, one, s, e)
    iters = max(1, min(max_iters, int(rep_us / one)))
    if len(fns) > 1:
        iters = -(-max(iters, len(fns)) // len(fns)) * len(fns)
    run = None
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(g):
            for i in range(iters):
                fns[i % len(fns)]()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        run = g.replay
    times = []
    for _ in range(reps):
        s.record()
        if run is not None:
            run()
        else:
            for i in range(iters):
                fns[i % len(fns)]()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / iters)
    return statistics.median(times)


def steady_for(steady_ms: float, fastest_us: float) -> float:
    """The warm-up a problem's re-timing takes: ``steady_ms`` where its
    fastest screened option took STEADY_MIN_US or more (a heavy problem,
    ranked at the power cap's clock), else 0 (bursts). Tune and the held-out
    benchmark decide per problem with it, then pass ``steady_min_us=0`` so
    every function they compare gets the same warm-up."""
    return steady_ms if steady_ms and fastest_us >= STEADY_MIN_US else 0.0


def _run_for(fns: list[Fn], total_us: float, one_us: float, s, e) -> None:
    """Call ``fns`` in rotation until about ``total_us`` of GPU time has
    passed (``time_us``'s ``steady_ms``), synchronizing every ~50 ms so the
    host never queues far ahead of the GPU."""
    chunk = max(1, int(50_000 / one_us))
    done, i = 0.0, 0
    while done < total_us:
        s.record()
        for _ in range(chunk):
            fns[i % len(fns)]()
            i += 1
        e.record()
        e.synchronize()
        done += s.elapsed_time(e) * 1e3


def interleaved(fns: Sequence[Fn | Sequence[Fn]], *, rounds: int = 3, reps: int = 3,
                rep_us: float = 300.0, graph: bool = False, steady_ms: float = 0.0,
                steady_min_us: float = STEADY_MIN_US) -> list[float]:
    """Median µs per call of each function (or each function per operand
    set, as ``time_us`` takes), timed round-robin over ``rounds``."""
    per: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for i in round_order(len(fns), r):
            per[i].append(time_us(fns[i], reps=reps, rep_us=rep_us, warmup=1, graph=graph,
                                  steady_ms=steady_ms, steady_min_us=steady_min_us))
    return [statistics.median(x) for x in per]


def round_order(count: int, round_index: int) -> list[int]:
    """The order ``count`` functions run in round ``round_index``: as given
    in even rounds, reversed in odd ones, so over two rounds every function
    stands at the same mean position (module docstring)."""
    order = list(range(count))
    return order[::-1] if round_index % 2 else order


TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def operands(layout: tuple, m: int, n: int, k: int, batch: int, device="cuda",
             with_c: bool = False):
    """Fresh random a, b, out for a call layout (a, b, d, a_major, b_major, d_major, rank),
    and with ``with_c`` a random C of out's dtype and layout after them."""
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
    if with_c:
        return a, b, out, mat(m, n, d_dt, d_major == "n")
    return a, b, out


def rotate(f: Callable, sets: Sequence[tuple]) -> list[Fn]:
    """``f`` bound to each operand set, for ``time_us``: ``f(*set)`` per call."""
    return [functools.partial(f, *args) for args in sets]


def cold_operands(layout: tuple, m: int, n: int, k: int, batch: int,
                  device="cuda", with_c: bool = False) -> list[tuple]:
    """``copies_for`` sets of fresh (a, b, out) for a call layout, with
    ``with_c`` (a, b, out, c): the L2 policy's operand rotation (module
    docstring)."""
    size = {name: TORCH_DTYPES[dt].itemsize for name, dt in zip("abd", layout[:3])}
    nbytes = batch * (m * k * size["a"] + k * n * size["b"] + m * n * size["d"] * (1 + with_c))
    count = copies_for(nbytes, l2_bytes(torch.device(device).index or 0))
    return [operands(layout, m, n, k, batch, device, with_c) for _ in range(count)]


__all__ = ["L2_POLICY", "STEADY_MIN_US", "TORCH_DTYPES", "cold_operands", "copies_for", "interleaved", "l2_bytes",
           "operands", "rotate", "round_order", "steady_for", "time_us"]
