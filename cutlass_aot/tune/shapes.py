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
      - a: bf16                 # an epilogue: a per-column bias and an activation
        bias: bf16              # null (default) | f16 | bf16 | f32
        act: gelu               # none (default) | relu | gelu | gelu_erf | silu
        m: [1024, 4096]
        nk: [[6144, 4096]]
      - a: bf16                 # a residual: D = A @ B + beta * C, C of D's dtype
        with_c: true            # false (default) | true; C laid out as D
        m: [1, 128, 4096]
        nk: [[4096, 14336]]

A shape file (``tune --shapes FILE``) holds the same list, in YAML or JSON,
as its top level or under ``tune:``. A shape log (``tune --from-log``) is
what services record with CUTLASS_AOT_SHAPE_LOG (format: cutlass_aot/shapelog.py).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..signature import GEMM_ACTS, gemm_signature

_GROUP_KEYS = {"a", "b_major", "a_major", "d", "d_major", "rank", "bias", "act", "with_c", "shapes",
               "m", "nk"}
_MAX_DIM = 1 << 20
# A shape set's problems after m x nk expansion. Each costs the tuner about a
# second, so more than this is a typo (a pasted range), not a plan.
MAX_PROBLEMS = 1 << 16


@dataclass(frozen=True)
class Problem:
    """One problem to tune: a call layout and (M, N, K, L)."""

    layout: tuple  # (a, b, d, a_major, b_major, d_major, rank)
    m: int
    n: int
    k: int
    l: int = 1  # noqa: E741 - the batch dim's usual name
    bias: str | None = None  # the bias vector's dtype (None: no bias)
    act: str = "none"
    c: str | None = None  # a residual C's dtype: D's, laid out as D (None: no C)

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
    """Problems of a shape-set document (see the module docstring), each once,
    in first-seen order; at most ``MAX_PROBLEMS`` of them."""
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
            raise _bad(w, f"unknown keys {sorted(map(str, extra))}; allowed: {sorted(_GROUP_KEYS)}")
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
        if type(rank) is not int or rank not in (2, 3):
            raise _bad(w, f"rank must be 2 or 3, not {rank!r}")
        layout = (a, a, d, a_major, b_major, d_major, rank)
        bias, act = g.get("bias"), g.get("act", "none")
        if bias not in (None, "f16", "bf16", "f32"):
            raise _bad(w, f"bias must be null, f16, bf16 or f32, not {bias!r}")
        if act not in GEMM_ACTS:
            raise _bad(w, f"act must be one of {', '.join(GEMM_ACTS)}, not {act!r}")
        with_c = g.get("with_c", False)
        if type(with_c) is not bool:
            raise _bad(w, f"with_c must be true or false, not {with_c!r}")
        # dispatch takes C only in out's dtype and layout (select.call_signature)
        epi = {"bias": bias, "act": act, "c": d if with_c else None}
        if "shapes" in g:
            if not isinstance(g["shapes"], list) or not g["shapes"]:
                raise _bad(w, "shapes must be a non-empty list of [M, N, K] or [L, M, N, K]")
            for s in g["shapes"]:
                if not isinstance(s, list) or len(s) not in (3, 4):
                    raise _bad(w, f"shape {s!r} is not [M, N, K] or [L, M, N, K]")
                dims = [_dim(w, x) for x in s]
                if len(dims) == 4 and rank == 2 and dims[0] != 1:
                    raise _bad(w, f"shape {s!r} has L={dims[0]}, but rank 2 has no batch: "
                                  "give [M, N, K], or rank: 3")
                if len(dims) == 4:
                    out.append(Problem(layout, dims[1], dims[2], dims[3], dims[0], **epi))
                else:
                    out.append(Problem(layout, *dims, **epi))
        elif "m" in g and "nk" in g:
            ms, nks = g["m"], g["nk"]
            if not isinstance(ms, list) or not ms or not isinstance(nks, list) or not nks:
                raise _bad(w, "m is a list of token counts and nk a list of [N, K] pairs")
            if len(out) + len(ms) * len(nks) > MAX_PROBLEMS:
                raise _bad(w, f"m x nk expands to {len(ms) * len(nks)} problems, and the set "
                              f"may hold at most {MAX_PROBLEMS}: list the token counts a "
                              "service meets (a few buckets), not every value")
            for nk in nks:
                if not isinstance(nk, list) or len(nk) != 2:
                    raise _bad(w, f"nk entry {nk!r} is not [N, K]")
                for m in ms:
                    out.append(Problem(layout, _dim(w, m), _dim(w, nk[0]), _dim(w, nk[1]), **epi))
        else:
            raise _bad(w, "give shapes:, or m: and nk:")
        if len(out) > MAX_PROBLEMS:
            raise _bad(w, f"the set holds more than {MAX_PROBLEMS} problems: list the shapes a "
                          "service meets, not every value")
    return list(dict.fromkeys(out))


def load_shape_file(path: str | Path) -> list[Problem]:
    """Problems of a YAML or JSON shape file."""
    import yaml  # noqa: PLC0415 - build/tune side only

    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read shape file {p}: {exc}", path=str(p)) from None
    except RecursionError:  # nested past the parser's limit: no shape file is
        raise UsageError(f"cannot read shape file {p}: nested too deeply to be a list of "
                         "groups", path=str(p)) from None
    return parse_groups(data, str(p))


# What a logged record's signature may carry: gemm_signature's fields (its
# keyword parameters, arch aside), read from it so the two cannot drift.
_LOGGED_FIELDS = frozenset(inspect.signature(gemm_signature).parameters) - {"arch"}


def _logged_problem(fields: dict, rec) -> Problem:
    """A logged GEMM call as the problem ``tune`` measures, through the shape
    file's own checks (UsageError for what a shape file would refuse, and for
    calls the tuner cannot time as logged: operands below 16-byte alignment,
    or A and B of two dtypes, which it would otherwise time on the 16-byte
    signature of one dtype and file under it). A call with C is timed with a
    C of D's dtype and layout, the only C dispatch takes: until r64 such calls
    were skipped, and a service's residual calls never got a row."""
    if fields.get("align") != 16 or fields.get("b") != fields.get("a"):
        raise UsageError("tune times 16-byte calls with one input dtype")
    unknown = set(fields) - _LOGGED_FIELDS
    if unknown:
        # a field this version does not know (a newer writer's): timing the
        # call without it would file the plain signature's answer under it
        raise UsageError(f"a logged signature field this version does not know: {sorted(unknown)}")
    group = {key: fields[key] for key in ("a", "d", "a_major", "b_major", "d_major", "rank")
             if key in fields}
    c = fields.get("c")
    if c not in (None, "-") and c != fields.get("d"):
        raise UsageError(f"a logged C of dtype {c} with D of {fields.get('d')}: dispatch takes "
                         "C only in D's dtype")
    group.update(bias=fields.get("bias"), act=fields.get("act", "none"),
                 with_c=c not in (None, "-"), shapes=[[rec.l, rec.m, rec.n, rec.k]])
    (problem,) = parse_groups([group], "shape log record")
    return problem


def read_shape_log(paths: Iterable[str | Path]) -> tuple[list[tuple[str, Problem]], int]:
    """(signature text, problem) of every GEMM record of the shape logs, and how many
    lines were skipped (cutlass_aot/shapelog.py parses; malformed lines never fail).

    Records of any outcome count (a miss is worth tuning once it is built);
    duplicates collapse to one problem; zero-size problems are skipped, and
    records a shape file could not state (see ``_logged_problem``) are
    skipped and counted with the malformed lines.
    """
    from ..shapelog import read_shape_logs  # noqa: PLC0415 - only for --from-log

    try:
        records, skipped = read_shape_logs(paths)
    except OSError as exc:
        raise UsageError(f"cannot read shape log {exc.filename}: {exc.strerror}",
                         path=str(exc.filename)) from None
    seen: dict[tuple, tuple[str, Problem]] = {}
    unusable = 0
    for rec in records:
        fields = dict(rec.signature.fields)
        if rec.signature.op != "gemm" or min(rec.m, rec.n, rec.k, rec.l) < 1:
            continue
        try:
            # The epilogue is part of the signature: a logged bias+GELU call
            # is tuned on its own variants, not on the plain signature's.
            problem = _logged_problem(fields, rec)
        except UsageError:
            unusable += 1
            continue
        text = rec.signature.text()
        seen[(text, rec.m, rec.n, rec.k, rec.l)] = (text, problem)
    return list(seen.values()), sum(skipped.values()) + unusable


__all__ = ["Problem", "load_shape_file", "parse_groups", "read_shape_log"]
