"""Shape sets for `cutlass-aot tune`: which problems to measure, for which calls.

Pure (standard library and PyYAML): parsed and validated on any machine, so
a manifest's ``tune:`` section fails at manifest load, not on the GPU.

A shape set is a list of groups. Each group names a call layout, with the
defaults of an nn.Linear call (A row-major, B = W.t(), D row-major), and its
problems, either listed or as M buckets times (N, K) pairs (a model's
layers at several token counts)::

    tune:
      - a: bf16                 # f16 | bf16 (required)
        b_major: k              # k (B = W.t(), default) | n
        d: bf16                 # default: a's dtype
        shapes: [[128, 4096, 4096], [1, 14336, 4096]]    # [M, N, K] or [L, M, N, K]
      - a: f16
        m: [1, 16, 128, 1024, 8192]
        nk: [[4096, 4096], [28672, 4096], [4096, 14336]]

A shape file (``tune --shapes FILE``) holds the same list, in YAML or JSON,
as its top level or under ``tune:``. A shape log (``tune --from-log``) is
what services record with CUTLASS_AOT_SHAPE_LOG: one JSON object a line
with the call's signature text and m, n, k, l.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

_GROUP_KEYS = {"a", "b_major", "a_major", "d", "d_major", "rank", "shapes", "m", "nk"}
_MAX_DIM = 1 << 20


@dataclass(frozen=True)
class Problem:
    """One problem to tune: a call layout and (M, N, K, L)."""

    layout: tuple  # (a, b, d, a_major, b_major, d_major, rank)
    m: int
    n: int
    k: int
    l: int = 1  # noqa: E741 - the batch dim's usual name

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.l)


def _bad(where: str, msg: str) -> UsageError:
    return UsageError(f"{where}: {msg}", where=where)


def _dim(where: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= _MAX_DIM:
        raise _bad(where, f"dimension {v!r} is not an int in 1..{_MAX_DIM}")
    return v


def parse_groups(data: Any, where: str) -> list[Problem]:
    """Problems of a shape-set document (see the module docstring)."""
    if isinstance(data, dict) and "tune" in data:
        data = data["tune"]
    if not isinstance(data, list) or not data:
        raise _bad(where, "a shape set is a non-empty list of groups")
    out: list[Problem] = []
    for i, g in enumerate(data):
        w = f"{where}: group {i}"
        if not isinstance(g, dict):
            raise _bad(w, "a group is a mapping (a:, shapes: or m: + nk:)")
        extra = set(g) - _GROUP_KEYS
        if extra:
            raise _bad(w, f"unknown keys {sorted(extra)}; allowed: {sorted(_GROUP_KEYS)}")
        a = g.get("a")
        if a not in ("f16", "bf16"):
            raise _bad(w, f"a must be f16 or bf16, not {a!r}")
        d = g.get("d", a)
        if d not in ("f16", "bf16", "f32"):
            raise _bad(w, f"d must be f16, bf16 or f32, not {d!r}")
        a_major, b_major, d_major = g.get("a_major", "k"), g.get("b_major", "k"), g.get("d_major", "n")
        if a_major not in ("k", "m") or b_major not in ("k", "n") or d_major not in ("n", "m"):
            raise _bad(w, "a_major is k|m, b_major k|n, d_major n|m")
        rank = g.get("rank", 2)
        if rank not in (2, 3):
            raise _bad(w, f"rank must be 2 or 3, not {rank!r}")
        layout = (a, a, d, a_major, b_major, d_major, rank)
        if "shapes" in g:
            if not isinstance(g["shapes"], list) or not g["shapes"]:
                raise _bad(w, "shapes must be a non-empty list of [M, N, K] or [L, M, N, K]")
            for s in g["shapes"]:
                if not isinstance(s, list) or len(s) not in (3, 4):
                    raise _bad(w, f"shape {s!r} is not [M, N, K] or [L, M, N, K]")
                dims = [_dim(w, x) for x in s]
                if len(dims) == 4:
                    out.append(Problem(layout, dims[1], dims[2], dims[3], dims[0]))
                else:
                    out.append(Problem(layout, *dims))
        elif "m" in g and "nk" in g:
            ms, nks = g["m"], g["nk"]
            if not isinstance(ms, list) or not ms or not isinstance(nks, list) or not nks:
                raise _bad(w, "m is a list of token counts and nk a list of [N, K] pairs")
            for nk in nks:
                if not isinstance(nk, list) or len(nk) != 2:
                    raise _bad(w, f"nk entry {nk!r} is not [N, K]")
                for m in ms:
                    out.append(Problem(layout, _dim(w, m), _dim(w, nk[0]), _dim(w, nk[1])))
        else:
            raise _bad(w, "give shapes:, or m: and nk:")
    return out


def load_shape_file(path: str | Path) -> list[Problem]:
    """Problems of a YAML or JSON shape file."""
    import yaml  # noqa: PLC0415 - build/tune side only

    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read shape file {p}: {exc}", path=str(p)) from None
    return parse_groups(data, str(p))


def layout_of_signature(fields: dict) -> tuple:
    return (fields["a"], fields["b"], fields["d"], fields["a_major"], fields["b_major"],
            fields["d_major"], fields["rank"])


def read_shape_log(paths: Iterable[str | Path]) -> tuple[list[tuple[str, Problem]], int]:
    """(signature text, problem) of every well-formed log line, and how many were skipped.

    A malformed or truncated line (a writer killed mid-line) is skipped and
    counted, never fatal. Duplicates collapse to one problem.
    """
    seen: dict[tuple, tuple[str, Problem]] = {}
    skipped = 0
    for path in paths:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read shape log {path}: {exc}", path=str(path)) from None
        for line in lines:
            try:
                rec = json.loads(line)
                sig = rec["signature"]
                dims = tuple(int(rec[x]) for x in ("m", "n", "k", "l"))
                fields = _fields_of_text(sig)
                if not isinstance(sig, str) or min(dims) < 1 or fields is None:
                    raise ValueError(line)
            except (ValueError, KeyError, TypeError):
                skipped += 1
                continue
            prob = Problem(layout_of_signature(fields), *dims[:3], dims[3])
            seen[(sig, dims)] = (sig, prob)
    return list(seen.values()), skipped


def _fields_of_text(text: str) -> dict | None:
    """Fields of a GEMM signature text ``gemm[arch](k=v,...)``, or None."""
    if not isinstance(text, str) or not text.startswith("gemm[") or not text.endswith(")"):
        return None
    try:
        body = text[text.index("(") + 1:-1]
        fields: dict[str, Any] = {}
        for item in body.split(","):
            k, v = item.split("=", 1)
            fields[k] = None if v == "-" else int(v) if v.isdigit() else v
        layout_of_signature(fields)
    except (ValueError, KeyError):
        return None
    return fields


__all__ = ["Problem", "layout_of_signature", "load_shape_file", "parse_groups", "read_shape_log"]
