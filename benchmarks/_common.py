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


def header(title: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {title}\n\n- date: {now}\n- machine: {machine()}\n- commit: {commit()}\n\n"


def write(name: str, text: str, out: str | None) -> Path:
    path = Path(out) if out else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
