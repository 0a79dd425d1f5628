"""Helpers shared by the test modules: the tiny manifest, CLI subprocesses,
cache surgery (byte flips, index edits), file-tree snapshots, and the
reliability results table.

Test-only; imports the standard library and the core of cutlass_aot.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The session cache: three sm90_gemm variants, bf16, 128x128 tiles, rank 2.
TINY_MANIFEST = """\
arch: sm_90a
description: three small variants for the CPU test suite
kernels:
  - name: linear
    family: sm90_gemm
    params:
      a: bf16
      b_major: [k, n]
      tile: 128x128
  - name: residual
    family: sm90_gemm
    params:
      a: bf16
      with_c: true
      tile: 128x128
"""
TINY_VARIANTS = 3

# Only the residual (with_c) entry of TINY_MANIFEST: what `gc` keeps.
RESIDUAL_ONLY_MANIFEST = """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      with_c: true
      tile: 128x128
"""


# ----------------------------------------------------------------- processes
def subprocess_env(**extra: str | None) -> dict[str, str]:
    """The current environment with the repo importable (tests.families)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cutlass_aot.cli", *map(str, args)]


def run_cli(*args: Any, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``cutlass-aot ARGS`` in a fresh interpreter; never raises on exit codes."""
    return subprocess.run(
        cli_argv(*args), cwd=REPO, env=env or subprocess_env(),
        capture_output=True, text=True, timeout=timeout,
    )


def run_cli_json(*args: Any, timeout: float = 600, env: dict | None = None) -> tuple[int, dict, str]:
    """(exit code, parsed stdout, stderr) of ``cutlass-aot ARGS --json``."""
    proc = run_cli(*args, "--json", timeout=timeout, env=env)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"stdout of {' '.join(map(str, args))} is not JSON ({exc}):\n"
            f"stdout={proc.stdout!r}\nstderr={proc.stderr[-3000:]}"
        ) from None
    return proc.returncode, data, proc.stderr


def run_python(code: str, *args: Any, timeout: float = 300, env: dict | None = None,
               prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (optionally behind ``prefix``, e.g. setpriv)."""
    return subprocess.run(
        [*(prefix or []), sys.executable, "-c", code, *map(str, args)],
        cwd=REPO, env=env or subprocess_env(), capture_output=True, text=True, timeout=timeout,
    )


# ------------------------------------------------------------- cache surgery
def index_file(cache: Path) -> Path:
    return Path(cache) / "index.json"


def load_index_json(cache: Path) -> dict:
    return json.loads(index_file(cache).read_text())


def edit_index(cache: Path, mutate: Callable[[dict], None]) -> dict:
    """Hand-edit index.json, as an operator (or an attacker) would."""
    data = load_index_json(cache)
    mutate(data)
    index_file(cache).write_text(json.dumps(data, indent=1, sort_keys=True))
    return data


def artifact(cache: Path, key: str) -> Path:
    return Path(cache) / "entries" / key / "kernel.so"


def flip_byte(path: Path, offset: int | None = None) -> int:
    """XOR one byte (default: the middle one) with 0xFF; returns the offset."""
    data = bytearray(Path(path).read_bytes())
    if offset is None:
        offset = len(data) // 2
    data[offset] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    return offset


def truncate(path: Path, size: int | None = None) -> None:
    """Cut a file to ``size`` bytes (default: half)."""
    p = Path(path)
    os.truncate(p, p.stat().st_size // 2 if size is None else size)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its type, mode, size and mtime (ns)."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_size, st.st_mtime_ns)
    return out


def tree_bytes(path: Path) -> int:
    return sum(
        os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files
    )


def make_tree_writable(root: Path) -> None:
    """Undo ``chmod -R a-w`` so tmp dirs can be removed by a non-root user."""
    if not Path(root).exists():
        return
    os.chmod(root, os.stat(root).st_mode | stat.S_IWUSR)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.lstat(p).st_mode | stat.S_IWUSR)


def make_tree_readonly(root: Path) -> None:
    """``chmod -R a-w root``."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in files + dirs:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.lstat(p).st_mode & ~0o222)
    os.chmod(root, os.stat(root).st_mode & ~0o222)


def copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


class LoadSpy:
    """Records every tvm_ffi.load_module call (the loader's dlopen) and delegates.

    Instrumentation only: the real loader still runs. Tests assert a refused
    artifact produced no call, and that a good one did (so the spy is live).
    """

    def __init__(self, monkeypatch):
        import tvm_ffi  # noqa: PLC0415 - the run side imports it lazily too

        real = tvm_ffi.load_module
        self.calls: list[str] = []

        def load_module(path, *args, **kwargs):
            self.calls.append(str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(tvm_ffi, "load_module", load_module)


def mapped_files() -> set[str]:
    """Files mapped into this process (what dlopen has loaded)."""
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


# --------------------------------------------------------- reliability table
def reliability_scale() -> float:
    """CUTLASS_AOT_RELIABILITY_SCALE (default 1): multiplies every trial count."""
    return float(os.environ.get("CUTLASS_AOT_RELIABILITY_SCALE", "1") or "1")


def knob(name: str, default: int) -> int:
    """CUTLASS_AOT_RELIABILITY_<name> as an int, else ``default`` (trial counts)."""
    value = os.environ.get(f"CUTLASS_AOT_RELIABILITY_{name}")
    return int(value) if value else default


def scaled(base: int, minimum: int = 1) -> int:
    return max(minimum, round(base * reliability_scale()))


@dataclass
class ResultRow:
    scenario: str
    trials: int
    lost: int
    notes: list[str] = field(default_factory=list)


RESULTS: list[ResultRow] = []


def record(scenario: str, trials: int, lost: int, notes: list[str] | None = None) -> None:
    """Add a row to the table printed at the end of the run."""
    RESULTS.append(ResultRow(scenario, trials, lost, list(notes or [])))


def results_table() -> list[str]:
    if not RESULTS:
        return []
    width = max(len(r.scenario) for r in RESULTS)
    lines = [f"{'scenario':{width}s}  {'trials':>7s}  {'lost':>5s}",
             f"{'-' * width}  {'-' * 7}  {'-' * 5}"]
    for r in RESULTS:
        lines.append(f"{r.scenario:{width}s}  {r.trials:7d}  {r.lost:5d}")
        lines += [f"{'':{width}s}    note: {n}" for n in r.notes[:8]]
    return lines
