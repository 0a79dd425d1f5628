"""Selection tables: measured winners per shape, bound to a GPU and to variants.

Core module: standard library only. ``cutlass-aot tune`` writes a table,
``build --tuning`` imports one, the store publishes it into the cache like
an artifact (``tables/<sha256>.json``, listed in the index with its sha256),
and the run side reads the one measured on its GPU (see cache_layout.md,
"Selection tables").

Binding, chosen so that a table survives what does not change its meaning:

* to the GPU by product name, SM count and compute capability: a table
  measured on an H100 is not used on an H200 (``gpu_matches``);
* to variants by what they *are*, not by content key: the signature text,
  the family, the schedule parameters, and the code the row timed: the
  digest of the family's kernel sources, or the sha256 of the artifact
  itself. A rebuild under another toolchain, or a new way of computing
  keys, keeps every row (same sources); an edit to a kernel source that
  leaves a variant's artifact byte-identical keeps its rows (same bytes);
  an edit that changes the code drops the rows measured on the old code
  (``bind``). ``restamp`` moves a table's rows to the new source digest
  where the bytes prove the code unchanged, so the shipped table keeps
  binding under any toolchain;
* rows naming a variant the cache no longer has are skipped and counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import CacheError, IntegrityError, UsageError
from .layout import is_sha256

TABLE_FORMAT = "cutlass-aot-selection"
TABLE_VERSION = 1
TABLES_DIR = "tables"
SCHEDULE_FIELDS = ("tile", "cluster", "raster", "swizzle", "swap_ab", "split_k", "pingpong",
                   "k_cluster", "promote")
# A family's other tuning parameters (sm80_gemm: warps, bk, stages; absent
# from sm90_gemm's variants): part of the schedule identity too, so two
# variants that differ only there never share a row (select.Candidate.extra).
EXTRA_FIELDS = ("warps", "bk", "stages")
_ROW_INTS = ("m", "n", "k", "l", "splits")
_MxN = re.compile(r"[1-9][0-9]{0,4}x[1-9][0-9]{0,4}")


def gpu_identity(name: str, sm_count: int, capability: str) -> dict:
    return {"name": name, "sm_count": int(sm_count), "capability": capability}


def gpu_matches(table_gpu: Mapping, name: str, sm_count: int, capability: str) -> bool:
    return (table_gpu.get("name") == name and table_gpu.get("sm_count") == sm_count
            and table_gpu.get("capability") == capability)


def schedule_of(variant: Mapping) -> tuple:
    """The schedule parameters of a variant, in SCHEDULE_FIELDS order, with
    defaults, then the EXTRA_FIELDS it has, as (name, value) pairs."""
    defaults = {"cluster": "1x1", "raster": "m", "swizzle": 1, "swap_ab": False, "split_k": False,
                "pingpong": False, "k_cluster": 1, "promote": 0}
    return (*(variant.get(f, defaults.get(f)) for f in SCHEDULE_FIELDS), extra_of(variant))


def extra_of(variant: Mapping) -> tuple:
    """The EXTRA_FIELDS a variant has, as (name, value) pairs in that order."""
    return tuple((f, variant[f]) for f in EXTRA_FIELDS if f in variant)


def validate_table(data: Any, where: str, *, one_row_a_problem: bool = False) -> None:
    """Raise IntegrityError naming the first problem of a table document.

    ``one_row_a_problem``: also refuse two rows for one problem (the same
    signature, M, N, K, L). Checked where a user hands a table in (``build
    --tuning``, a manifest's ``tuning:``): which row a lookup found would
    hang on the order rows were read in. Tables already in a cache, a shard
    or a registry are read as before r51, the last such row winning, since
    r50's build shipped hand-written tables as given.
    """

    def bad(msg: str) -> IntegrityError:
        return IntegrityError(f"selection table {where}: {msg}; re-run `cutlass-aot tune` or "
                              "pass a table it wrote", path=where)

    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise bad("not a cutlass-aot selection table (format field missing or foreign)")
    if data.get("version") != TABLE_VERSION:
        raise bad(f"version {data.get('version')!r}, this cutlass-aot reads {TABLE_VERSION}")
    gpu = data.get("gpu")
    if not (isinstance(gpu, dict) and isinstance(gpu.get("name"), str)
            and isinstance(gpu.get("sm_count"), int) and isinstance(gpu.get("capability"), str)):
        raise bad("'gpu' must hold name, sm_count and capability")
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise bad("'rows' must be a list")
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise bad(f"row {i}: {problem}")
        if one_row_a_problem:  # two answers for one problem (tune and merge never write two)
            first = seen.setdefault(row_identity(row), i)
            if first != i:
                raise bad(f"rows {first} and {i} both answer {row['signature']} at "
                          f"M={row['m']} N={row['n']} K={row['k']} L={row['l']}: keep one")


def _row_problem(row: Any) -> str | None:
    if not isinstance(row, dict):
        return "not an object"
    for f in ("signature", "family", "kernel_sources"):
        if not isinstance(row.get(f), str) or not row[f]:
            return f"field {f!r} missing or not a string"
    for f in _ROW_INTS:
        v = row.get(f)
        # k may be 0 (an empty sum); splits 0 is stream-K (split-K ABI v3)
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if f in ("k", "splits") else 1):
            return f"field {f!r} missing or not a positive int"
    us = row.get("us")
    if not isinstance(us, (int, float)) or isinstance(us, bool) or not _finite(us) or us <= 0:
        return "field 'us' missing or not a positive number"
    variant = row.get("variant")
    if not isinstance(variant, dict) or any(f not in variant for f in ("tile", "cluster")):
        return "field 'variant' must name at least tile and cluster"
    for f in (*SCHEDULE_FIELDS, *EXTRA_FIELDS):
        # a schedule value is a key part (schedule_of): a list or an object
        # there cannot be one, and bind would raise on every call's lookup
        v = variant.get(f)
        if v is not None and not isinstance(v, (str, int, bool)):
            return f"field 'variant.{f}' must be a string, an integer or a boolean, not {type(v).__name__}"
    for f in ("tile", "cluster"):
        if not isinstance(variant[f], str) or not _MxN.fullmatch(variant[f]):
            return f"field 'variant.{f}' must be a string like '128x256', not {variant[f]!r:.40}"
    # The runner-up is optional (a row with one option has none), but when
    # present it must be a label and a finite margin: select.row_below reads them.
    runner, margin = row.get("runner_up"), row.get("margin")
    if runner is not None and not isinstance(runner, str):
        return "field 'runner_up' must be a label string or null"
    if margin is not None and (not isinstance(margin, (int, float)) or isinstance(margin, bool)
                               or not _finite(margin) or margin < 1):
        return "field 'margin' must be a number >= 1 (runner-up time / winner time) or null"
    # the regime a row was timed in (tune --steady-ms); absent: a burst
    steady = row.get("steady_ms")
    if "steady_ms" in row and (not isinstance(steady, (int, float)) or isinstance(steady, bool)
                               or not _finite(steady) or steady <= 0):
        return "field 'steady_ms' must be a positive number of ms when present"
    artifact = row.get("artifact")
    if artifact is not None and not is_sha256(artifact):
        return "field 'artifact' must be the sha256 (64 hex digits) of the artifact the row timed"
    return None


def _finite(x: int | float) -> bool:
    # an int is finite however large (math.isfinite would overflow converting it)
    return isinstance(x, int) or math.isfinite(x)


def parse_table_bytes(data: bytes, where: str, *, one_row_a_problem: bool = False) -> dict:
    """A table document from bytes another cache or a registry handed over:
    IntegrityError unless they parse as JSON and validate_table accepts them."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise IntegrityError(f"cannot read selection table {where}: it is not JSON ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); re-run `cutlass-aot tune` or pass a table it wrote",
                             path=where) from None
    validate_table(doc, where, one_row_a_problem=one_row_a_problem)
    return doc


def dumps_table(data: Mapping) -> bytes:
    """Canonical bytes of a table (sorted keys, compact): equal tables hash equal."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def load_table_file(path: str | Path) -> dict:
    """Read and validate a table file given by a user (``build --tuning``): bad input is a
    UsageError (exit 2) naming the file and the problem."""
    p = Path(path)
    try:
        return parse_table_bytes(p.read_bytes(), str(p), one_row_a_problem=True)
    except OSError as exc:
        raise UsageError(f"cannot read selection table {p}: {exc}", path=str(p)) from None
    except IntegrityError as exc:
        raise UsageError(exc.message, path=str(p)) from None


def row_identity(row: Mapping) -> tuple:
    """What a row measured: (signature, M, N, K, L)."""
    return (row["signature"], row["m"], row["n"], row["k"], row["l"])


def merge_rows(old: Iterable[Mapping], new: Iterable[Mapping]) -> list[dict]:
    """Rows of ``new`` replace rows of ``old`` that measured the same problem."""
    out = {row_identity(r): dict(r) for r in old}
    out.update({row_identity(r): dict(r) for r in new})
    return [out[k] for k in sorted(out, key=lambda t: (t[0], t[1:]))]


Entry = tuple[str, str, Mapping, "str | None", "str | None"]
"""What binding reads of a cache entry: (signature text, family, variant
params, kernel sources digest, artifact sha256)."""


def entry_of(record: Mapping, signature_text: str | None = None) -> Entry:
    """What binding reads of an index record; ``signature_text`` overrides
    the record's own (the run side passes its validated signature's)."""
    return (signature_text or record.get("signature_text"), record.get("family"),
            record.get("variant") or {}, record.get("kernel_sources"), record.get("sha256"))


def entries_of(records: Iterable[tuple[Mapping, str | None]]) -> list[Entry]:
    """``entry_of`` for (index record, signature text or None) pairs, oldest
    build first. Binding keeps the last entry listed for a variant
    (``_by_identity``), so in a cache that still lists an older build next to
    a newer one (before ``gc``) a row meets the build dispatch launches:
    select.candidates keeps the newest build per schedule too. The index
    itself is ordered by key, which says nothing about age."""
    pairs = sorted(records, key=lambda rs: str(rs[0].get("built_at") or ""))
    return [entry_of(rec, sig) for rec, sig in pairs]


def mixed_sources(entries: Iterable[Entry]) -> list[tuple]:
    """The (signature, family, schedule) identities that ``entries`` list
    with more than one kernel-source digest, sorted."""
    seen: dict[tuple, set] = {}
    for sig, family, variant, sources, _ in entries:
        seen.setdefault((sig, family, schedule_of(variant)), set()).add(sources)
    return sorted(k for k, v in seen.items() if len(v) > 1)


def _by_identity(entries: Iterable[Entry]) -> dict[tuple, tuple[str | None, str | None]]:
    """(signature, family, schedule) -> (sources, sha) of the last entry listed
    for it (``entries_of`` lists the newest build last)."""
    return {(sig, family, schedule_of(variant)): (sources, sha)
            for sig, family, variant, sources, sha in entries}


def _match(row: Mapping, have: Mapping[tuple, tuple[str | None, str | None]]
           ) -> tuple[str, str | None, str | None]:
    """How a row meets the cache's entries (``_by_identity``), with the
    matching entry's kernel sources digest and artifact sha256:
    ``missing_variant`` (no entry of its signature, family and schedule),
    ``same_sources`` (built from the sources the row was measured on),
    ``same_bytes`` (other sources, but the artifact is the file the row
    timed) or ``changed``."""
    hit = have.get((row["signature"], row["family"], schedule_of(row["variant"])))
    if hit is None:
        return "missing_variant", None, None
    sources, sha = hit
    if sources == row["kernel_sources"]:
        return "same_sources", sources, sha
    if sha is not None and row.get("artifact") == sha:
        return "same_bytes", sources, sha
    return "changed", sources, sha


def bind(rows: Iterable[Mapping], entries: Iterable[Entry]
         ) -> tuple[dict[str, dict[tuple, tuple]], dict[str, int]]:
    """Bind rows to the variants a cache has.

    A row binds to the entry of its signature, family and schedule when the
    entry was built from the kernel sources the row was measured on, or when
    the entry's artifact is the very file the row timed (its ``artifact``
    sha256). Returns ``{signature text: {(M, N, K, L): (schedule, splits,
    runner-up label, margin, us)}}`` (the runner-up as the row names it, for
    select.row_below; None when the row has none; ``us`` the winner's time,
    for select.row_above, None for a row timed at the power cap's clock,
    ``steady_ms``, which no burst row may be compared with) and counts: rows
    used (``same_bytes`` of them by the artifact alone), rows whose variant is
    gone, rows whose code changed.
    """
    have = _by_identity(entries)
    bound: dict[str, dict[tuple, tuple]] = {}
    counts = {"used": 0, "same_bytes": 0, "missing_variant": 0, "stale_source": 0}
    for row in rows:
        how = _match(row, have)[0]
        if how == "missing_variant":
            counts["missing_variant"] += 1
            continue
        if how == "changed":
            counts["stale_source"] += 1
            continue
        if how == "same_bytes":
            counts["same_bytes"] += 1
        counts["used"] += 1
        bound.setdefault(row["signature"], {})[(row["m"], row["n"], row["k"], row["l"])] = (
            _select_schedule(row["variant"]), int(row["splits"]), row.get("runner_up"),
            row.get("margin"), None if "steady_ms" in row else float(row["us"]))
    return bound, counts


def binding_rows(rows: Iterable[Mapping], entries: Iterable[Entry]) -> list[Mapping]:
    """The rows ``bind`` would use, as they are (the others are gone or stale)."""
    have = _by_identity(entries)
    return [r for r in rows if _match(r, have)[0] in ("same_sources", "same_bytes")]


def restamp(rows: Iterable[Mapping], entries: Iterable[Entry],
            baseline: Iterable[Entry] | None = None
            ) -> tuple[list[dict], dict[str, int], list[dict]]:
    """Rows re-stated against a cache built from newer kernel sources.

    For each row whose variant the cache has:

    * measured on the entry's sources: kept, and its ``artifact`` filled in
      from the entry when the row has none (the cache must then be the build
      the row timed: same sources, same toolchain);
    * measured on other sources, and the entry's artifact is the file the
      row timed: ``kernel_sources`` moves to the entry's digest (the code is
      byte for byte what was measured);
    * measured on other sources, the artifact differs from the file timed,
      but ``baseline`` (a build of the sources the row was measured on, by
      the same toolchain as ``entries``) holds the variant with the entry's
      very bytes: the source edit left this variant's code as it was, and
      only the toolchain differs from the build that was timed, which a row
      survives anyway (a rebuild elsewhere keeps it). ``kernel_sources`` and
      ``artifact`` move to the entry's (``rebuilt``);
    * otherwise the code changed: the row is kept as it is, stale, for a
      re-tune to replace.

    Rows naming a variant the cache lacks are kept as they are. Returns the
    rows, counts of ``current``, ``filled``, ``restamped``, ``rebuilt``,
    ``changed`` and ``missing_variant``, and the rows whose code changed.

    A cache that holds one variant built from two kernel-source digests
    (an incremental build after the edit, before ``gc`` dropped the old
    entries) cannot say which build a row meets: CacheError, naming the
    variants and the ``gc`` that fixes it, and nothing is restamped.
    """
    entries = list(entries)
    baseline = list(baseline or ())
    for which, listed in (("cache", entries), ("baseline", baseline)):
        mixed = mixed_sources(listed)
        if mixed:
            sig, _, schedule = mixed[0]
            raise CacheError(
                f"the {which} holds {len(mixed)} variant(s) built from more than one "
                f"kernel-source digest (e.g. {schedule} of {sig}): an older build's entries are "
                "still listed, so a row could meet the old build and read as current. Drop them "
                f"with `cutlass-aot gc MANIFESTS --cache-dir {which.upper()}`, then restamp",
                variants=mixed, which=which)
    have = _by_identity(entries)
    base = _by_identity(baseline)
    out: list[dict] = []
    changed: list[dict] = []
    counts = {"current": 0, "filled": 0, "restamped": 0, "rebuilt": 0, "changed": 0,
              "missing_variant": 0}
    for row in rows:
        new = dict(row)
        how, sources, sha = _match(row, have)
        then = base.get((row["signature"], row["family"], schedule_of(row["variant"])))
        if how == "missing_variant":
            counts["missing_variant"] += 1
        elif how == "same_sources":
            if row.get("artifact") is None and sha is not None:
                new["artifact"] = sha
                counts["filled"] += 1
            else:
                counts["current"] += 1
        elif how == "same_bytes" and sources:
            new["kernel_sources"] = sources
            counts["restamped"] += 1
        elif (sources and sha is not None and then is not None
              and then[0] == row["kernel_sources"] and then[1] == sha):
            new["kernel_sources"], new["artifact"] = sources, sha
            counts["rebuilt"] += 1
        else:
            counts["changed"] += 1
            changed.append(new)
        out.append(new)
    return out, counts, changed


def _select_schedule(variant: Mapping) -> tuple:
    """A row's variant as run/select.Candidate.schedule (schedule_of, parsed)."""
    tile, cluster, raster, swizzle, swap_ab, split_k, pingpong, k_cluster, promote, extra = schedule_of(variant)
    tm, tn = (int(x) for x in str(tile).split("x"))
    cm, cn = (int(x) for x in str(cluster).split("x"))
    return (tm, tn, cm, cn, str(raster), int(swizzle), bool(swap_ab), bool(split_k), bool(pingpong),
            int(k_cluster), int(promote), extra)


__all__ = [
    "EXTRA_FIELDS", "TABLE_FORMAT", "TABLE_VERSION", "TABLES_DIR", "bind", "binding_rows", "dumps_table",
    "entry_of", "extra_of",
    "gpu_identity", "gpu_matches", "load_table_file", "merge_rows", "parse_table_bytes", "restamp",
    "row_identity", "schedule_of", "validate_table",
]
