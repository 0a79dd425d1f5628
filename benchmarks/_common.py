"""Shared bits of the benchmark scripts: result files with date, machine, commit."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
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


def header(title: str) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {title}\n\n- date: {now}\n- machine: {machine()}\n- commit: {commit()}\n\n"


def write(name: str, text: str, out: str | None) -> Path:
    path = Path(out) if out else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
