"""Shared bits of the benchmark scripts: result files with date, machine, commit;
GPU timing; a `cutlass-aot build` subprocess; ptxas resource usage of the PTX
the CuTe DSL keeps."""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str:
    env = os.environ.get("CUTLASS_AOT_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=RESULTS.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return f"{p.name} ({p.multi_processor_count} SMs), torch {torch.__version__}"
    except ImportError:
        pass
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores (no GPU)"


def cuda_kernel_events(fn) -> list:
    """torch.profiler's CUDA kernel events of everything one call of ``fn``
    launches (the device synchronized before and after): each has ``name``,
    ``device_time`` and ``time_range``."""
    import torch  # noqa: PLC0415 - GPU scripts only

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]


def seconds(fn, iters: int, reps: int = 5) -> float:
    """Median seconds per call of ``fn``: 3 warm-up calls, then ``reps`` CUDA-event
    timings of ``iters`` back-to-back calls (eager launches, warm L2)."""
    import statistics  # noqa: PLC0415

    import torch  # noqa: PLC0415 - GPU scripts only

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / iters)
    return statistics.median(times)


def timed(fn, flops: float, iters: int, reps: int = 5) -> float:
    """TFLOP/s of ``fn`` (see ``seconds``)."""
    return flops / seconds(fn, iters, reps) / 1e12


def gmean(xs) -> float:
    """Geometric mean of positive numbers (nan for none)."""
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def max_rel_err(out, ref) -> float:
    """The benchmarks' result check: max |out - ref| / (|ref| + 1), in
    ``ref``'s dtype (NaN anywhere gives NaN, which fails every bound)."""
    return ((out.to(ref.dtype) - ref).abs() / (ref.abs() + 1.0)).max().item()


def recorded_best(paths: list[str], usable=None) -> dict[tuple[str, int, int, int], str]:
    """(dtype, M, N, K) -> the label of the fastest option the raws recorded:
    a bench_selection.py sweep's best, for a tile_probe.py record the
    faster of its old best and its best new option, or for a pick_ab.py
    record the faster of its A and B (each pair timed together there).

    Across files, a later record replaces an earlier one when it timed the
    earlier one's option too (a comparison within one run); when it did not,
    the faster of the two recorded times stands (two runs, but the only
    evidence), and where a time is missing the later record wins. Letting
    the later file win outright planned r27's second held-out run on r26's
    re-times of six shapes, which never timed the new tiles that r27's first
    run had found faster (814x8248x1224: 34.2 µs where the known best ran
    29.8). With ``usable(dtype, label)``, an option it refuses (a variant the
    cache no longer ships) gives way to the next fastest: a probe's other
    best, or a sweep's next option."""
    out: dict[tuple[str, int, int, int], tuple[float | None, str]] = {}
    for path in paths:
        for rec in load_raw(path):
            if "new_best" in rec:
                timed = sorted([(rec["new_best_us"], rec["new_best"]), (rec["old_best_us"], rec["old_best"])])
            elif "a_us" in rec:  # a pick_ab.py pair: A and B were timed together
                timed = sorted([(rec["a_us"], rec["a"]), (rec["b_us"], rec["b"])])
            else:
                timed = [(rec.get("best_us"), rec["best"])] + [
                    (o[3], o[0]) for o in sorted(rec.get("options", []), key=lambda o: o[3])]
            ranked = [(t, label) for t, label in timed if usable is None or usable(rec["dtype"], label)]
            if not ranked:
                continue
            shape = (rec["dtype"], rec["m"], rec["n"], rec["k"])
            held = out.get(shape)
            top = ranked[0]
            if (held is None or held[1] in {label for _, label in timed} or None in (held[0], top[0])
                    or top[0] <= held[0]):
                out[shape] = top
    return {shape: label for shape, (_, label) in out.items()}


def load_raw(path: str) -> list[dict]:
    """The records of a ``bench_selection.py --raw`` file, plain or xz-compressed
    (as kept under results/raw/)."""
    import lzma  # noqa: PLC0415

    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
        return json.load(f)


def fastest_us(rec: dict) -> float:
    """A bench_selection record's fastest cached option as re-timed: the
    least of the screen's best and the picks, all timed interleaved with
    cuBLAS (the figure each pick's regret divides by). A record since r55
    holds it (``fastest_us``); an older one has every part of it."""
    if "fastest_us" in rec:
        return rec["fastest_us"]
    picks = [rec[m]["us"] for m in ("model", "dispatch", "autotune")
             if isinstance(rec.get(m), dict) and math.isfinite(rec[m].get("us", math.nan))]
    return min([rec["best_us"], *picks])


def best_vs(rec: dict) -> float:
    """cuBLAS's time over the fastest cached option's, both as re-timed
    (``fastest_us``; before r55 the reports took the screen's best re-timed,
    which a pick can beat)."""
    return rec["cublas_us"] / fastest_us(rec)


def timing_drift(records: list[dict], tolerance: float = 1.15) -> tuple[float, list[dict]]:
    """How far each record's best option moved between the sweep and the
    interleaved re-timing (bench_selection.py's raw format): the median of
    re-timed / swept over the records, and the records outside
    [1/tolerance, tolerance], worst first, each with a ``drift`` field.

    The same option, on the same operands, minutes apart in one process: a
    large move means that record's ratio to cuBLAS depends on when it was
    taken (the clocks under sustained load, most likely; the harness records
    none). What r52 saw, and the two readings of it, are in
    sustained_probe.py's docstring, the probe that tells them apart."""
    drifts, off = [], []
    for r in records:
        swept = next((o[3] for o in r.get("options", ()) if o[0] == r["best"]), None)
        if not swept:
            continue
        d = r["best_us"] / swept
        drifts.append(d)
        if not 1 / tolerance <= d <= tolerance:
            off.append({**r, "drift": d})
    drifts.sort()
    median = drifts[len(drifts) // 2] if drifts else float("nan")
    return median, sorted(off, key=lambda r: -max(r["drift"], 1 / r["drift"]))


def drift_lines(records: list[dict], tolerance: float = 1.15) -> str:
    """timing_drift's finding as report text: one summary line, then a table
    of the moved records (none: the line alone)."""
    median, off = timing_drift(records, tolerance)
    text = (f"- timing drift (best option re-timed / its sweep time): median {median:.3f}; "
            f"{len(off)} of {len(records)} outside {1 / tolerance:.2f}-{tolerance:.2f}"
            + (" (the same option moved: those rows' ratios to cuBLAS are unreliable)\n" if off else "\n"))
    if off:
        text += ("\n| dtype | shape | best | swept µs | re-timed µs | drift | cuBLAS µs |\n"
                 "|---|---|---|---|---|---|---|\n")
        for r in off:
            swept = r["best_us"] / r["drift"]
            text += (f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r['best']} | {swept:.1f} | "
                     f"{r['best_us']:.1f} | {r['drift']:.2f} | {r['cublas_us']:.1f} |\n")
    return text


def header(title: str) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {title}\n\n- date: {now}\n- machine: {machine()}\n- commit: {commit()}\n\n"


def write(name: str, text: str, out: str | None) -> Path:
    path = Path(out) if out else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cli_build(manifests: list[str], cache: str, jobs: int) -> tuple[float, dict]:
    """Run `cutlass-aot build --json` as a subprocess: (wall seconds, its report)."""
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "cutlass_aot.cli", "build", *manifests, "--cache-dir", cache,
         "--jobs", str(jobs), "--json"], capture_output=True, text=True, cwd=RESULTS.parent.parent)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"build failed ({res.returncode}): {res.stdout[-2000:]} {res.stderr[-2000:]}")
    return wall, json.loads(res.stdout)


def linear_candidates(cache, dtype: str, sms: int | None = None, *, bias: str | None = None,
                      act: str = "none") -> tuple[int, list]:
    """(SM count of GPU 0, the candidates dispatch reads from ``cache``) for the
    nn.Linear call in ``dtype``: A row-major, B = w.t(), D row-major, rank 2,
    with the epilogue's ``bias`` dtype and ``act`` where given.
    With ``sms`` (planning on a machine with no GPU) the arch is sm_90a and
    that SM count is returned."""
    from cutlass_aot.run.dispatch import device_info  # noqa: PLC0415 - GPU scripts only
    from cutlass_aot.signature import gemm_signature  # noqa: PLC0415

    arch = "sm_90a"
    if sms is None:
        arch, sms, _, _ = device_info(0)
    sig = gemm_signature(arch, a=dtype, b=dtype, d=dtype, c=None, a_major="k", b_major="k",
                         d_major="n", rank=2, bias=bias, act=act)
    return sms, cache.gemm.runner._candidates_for(sig)


def keep_ptx(dump: str) -> None:
    """Tell the CuTe DSL to keep each compile's PTX under ``dump``; call before
    the DSL is imported (it reads the environment then)."""
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump


def ptxas_resources(dump: str, arch: str) -> list[dict]:
    """``ptxas -arch=ARCH -v`` on each PTX file under ``dump``, then delete it.

    Every compile writes its PTX under the same name, so call this after each
    compile. One dict per file, each value a list with one item per kernel:
    ``registers``, ``spills`` ((stores, loads) bytes), ``stack`` and ``smem``
    (static bytes), as ptxas prints them.
    """
    found = []
    for ptx in sorted(glob.glob(os.path.join(dump, "**", "*.ptx"), recursive=True)):
        text = subprocess.run(["ptxas", f"-arch={arch}", "-v", "-o", os.devnull, ptx],
                              capture_output=True, text=True).stderr
        found.append({
            "registers": re.findall(r"Used (\d+) registers", text),
            "spills": re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text),
            "stack": re.findall(r"(\d+) bytes stack frame", text),
            "smem": re.findall(r"(\d+) bytes smem", text),
        })
        os.unlink(ptx)
    return found


def parse_tiles(text: str) -> set[tuple[int, int]]:
    """``MxN[,MxN...]`` as a set of (M, N) int pairs; ValueError names the bad part."""
    out = set()
    for part in text.split(","):
        dims = part.strip().split("x")
        if len(dims) != 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"{part.strip()!r} is not a tile MxN with positive integers")
        out.add((int(dims[0]), int(dims[1])))
    return out


def tiles_arg(text: str) -> set[tuple[int, int]]:
    """``parse_tiles`` as an argparse type (a bad part is a usage error, exit 2)."""
    try:
        return parse_tiles(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
