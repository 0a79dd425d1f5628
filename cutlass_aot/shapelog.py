"""The shape log: one JSON line per (signature, M, N, K, L, outcome) a process met.

Core module: standard library only (plus the core ``signature`` and
``knobs``), so the run side writes it, and the CLI (``cutlass-aot coverage``,
``cutlass-aot tune --from-log``) or a second tool reads it without torch.

Opt-in: set ``CUTLASS_AOT_SHAPE_LOG=/path/to/log.jsonl``. The run side calls
``log_shape`` on its slow path only (the first call of a new dispatch key, a
miss, a fallback), never per cached call. Each distinct record is written at
most once per process and path.

Line format, version 1 (one JSON object, keys in this order, then ``\\n``)::

    {"v": 1, "outcome": "hit" | "fallback" | "miss",
     "signature": "gemm[sm_90a](a=bf16,...)",           # Signature.text()
     "sig": {"op": ..., "arch": ..., "fields": {...}},  # Signature.as_dict(): exact types
     "m": M, "n": N, "k": K, "l": L,                    # ints >= 0; L = 1 for rank 2
     "pid": 1234, "t": 1764470000.123}                  # writer and unix time

* ``hit``: an artifact served the call; ``fallback``: no artifact did and
  the call ran through torch (``on_miss="torch"``); ``miss``: no artifact did
  and the call raised KernelNotFoundError.
* ``cutlass-aot tune --from-log`` (cutlass_aot/tune/shapes.py) reads the
  text of ``signature`` and the dims; everything else reads ``sig``.
* Readers ignore keys they do not know, and skip (and count) any line that is
  not a complete version-1 record: torn, truncated, hand-edited, or of a
  newer version.

Append safety across processes: each record is one ``os.write`` of a whole
line, shorter than PIPE_BUF (4096 bytes), to a descriptor opened with
O_APPEND. On a local filesystem such a write lands in one piece at the end
of the file, so concurrent writers interleave whole lines, never parts of
them. A record that would be longer, or whose dims the reader would refuse, is not
written (counted in ``LOG_STATE["dropped"]``). Write errors (a full disk, a read-only path)
never fail the GEMM call: they are counted, and reported once as a
RuntimeWarning.
"""

from __future__ import annotations

import json
import math
import operator
import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import knobs
from .signature import Signature

VERSION = 1
OUTCOMES = ("hit", "fallback", "miss")
# POSIX guarantees at least 512; Linux's is 4096. A line must fit in one write.
LINE_LIMIT = 4096

_SEEN: set[tuple] = set()
_LOCK = threading.Lock()
# Process-wide counters of the writer, for tests and diagnostics.
LOG_STATE = {"written": 0, "dropped": 0, "errors": 0}


@dataclass(frozen=True)
class ShapeRecord:
    """One parsed shape-log line."""

    signature: Signature
    m: int
    n: int
    k: int
    l: int  # noqa: E741 - the batch extent is called L everywhere in this project
    outcome: str
    pid: int | None = None
    t: float | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.l)


def format_line(sig: Signature, m: int, n: int, k: int, l: int, outcome: str,  # noqa: E741
                *, pid: int | None = None, t: float | None = None) -> bytes:
    """The bytes of one log line (ending in a newline)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"shape-log outcome must be one of {OUTCOMES}, got {outcome!r}")
    dims = []
    for name, dim in (("m", m), ("n", n), ("k", k), ("l", l)):
        # What the reader accepts, so nothing written is skipped as malformed.
        try:
            value = operator.index(dim) if not isinstance(dim, bool) else -1
        except TypeError:
            value = -1
        if value < 0:
            raise ValueError(f"shape-log dim {name} must be an int >= 0, got {dim!r}")
        dims.append(value)
    record = {
        "v": VERSION, "outcome": outcome, "signature": sig.text(), "sig": sig.as_dict(),
        "m": dims[0], "n": dims[1], "k": dims[2], "l": dims[3],
        "pid": os.getpid() if pid is None else pid,
        "t": round(time.time() if t is None else t, 3),
    }
    # json.dumps escapes control characters, so the only newline is the last byte.
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def log_shape(sig: Signature, m: int, n: int, k: int, l: int, outcome: str) -> bool:  # noqa: E741
    """Append a record to $CUTLASS_AOT_SHAPE_LOG, once per process; True if written.

    Slow path only. Does nothing (and costs one environment read) when the
    knob is unset. Never raises for I/O problems.
    """
    path = knobs.shape_log()
    if not path:
        return False
    key = (path, sig, m, n, k, l, outcome)
    if key in _SEEN:
        return False
    with _LOCK:
        if key in _SEEN:
            return False
        _SEEN.add(key)
        try:
            line = format_line(sig, m, n, k, l, outcome)
        except ValueError:  # a dim the reader would skip: never fail the call for the log
            LOG_STATE["dropped"] += 1
            return False
        if len(line) >= LINE_LIMIT:
            LOG_STATE["dropped"] += 1
            return False
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                written = os.write(fd, line)  # one write: the whole line or (disk full) a torn one
            finally:
                os.close(fd)
        except OSError as exc:
            LOG_STATE["errors"] += 1
            if LOG_STATE["errors"] == 1:
                warnings.warn(f"cutlass-aot: cannot write the shape log {path} ({exc}); "
                              "shapes are not being logged", RuntimeWarning, stacklevel=3)
            return False
        if written != len(line):
            LOG_STATE["errors"] += 1
            return False
        LOG_STATE["written"] += 1
        return True


def forget_logged() -> None:
    """Forget which records this process wrote (tests; a new log path)."""
    with _LOCK:
        _SEEN.clear()


def parse_line(line: str | bytes) -> ShapeRecord | None:
    """A record from one line, or None for anything that is not a valid v1 record."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or type(data.get("v")) is not int or data["v"] != VERSION:
        return None
    outcome = data.get("outcome")
    if outcome not in OUTCOMES:
        return None
    dims = [data.get(name) for name in ("m", "n", "k", "l")]
    if not all(type(d) is int and d >= 0 for d in dims):
        return None
    sig_data = data.get("sig")
    try:
        if not isinstance(sig_data, dict) or not isinstance(sig_data.get("fields"), dict):
            return None
        if not (isinstance(sig_data.get("op"), str) and isinstance(sig_data.get("arch"), str)):
            return None
        sig = Signature.from_dict(sig_data)
    except (KeyError, TypeError, ValueError):
        return None
    pid, t = data.get("pid"), data.get("t")
    return ShapeRecord(
        signature=sig, m=dims[0], n=dims[1], k=dims[2], l=dims[3], outcome=outcome,
        pid=pid if type(pid) is int else None,
        t=_seconds(t),
    )


def _seconds(t) -> float | None:
    """A record's time stamp as a finite float, or None (an int too large for
    a float, NaN or infinity is junk, not a crash)."""
    if type(t) not in (int, float):
        return None
    try:
        t = float(t)
    except OverflowError:
        return None
    return t if math.isfinite(t) else None


def read_shape_log(path: str | os.PathLike) -> tuple[list[ShapeRecord], int]:
    """(records, skipped lines) of one log file; blank lines are neither.

    Never raises for the content of the file (malformed, truncated, binary
    garbage, a newer version): such lines are skipped and counted. Raises
    OSError if the file cannot be opened.
    """
    records: list[ShapeRecord] = []
    skipped = 0
    with open(Path(path), "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            rec = parse_line(raw)
            if rec is None:
                skipped += 1
            else:
                records.append(rec)
    return records, skipped


def read_shape_logs(paths: Iterable[str | os.PathLike]) -> tuple[list[ShapeRecord], dict[str, int]]:
    """Records of several logs, and the skipped-line count of each path."""
    records: list[ShapeRecord] = []
    skipped: dict[str, int] = {}
    for p in paths:
        recs, bad = read_shape_log(p)
        records += recs
        skipped[str(p)] = bad
    return records, skipped
