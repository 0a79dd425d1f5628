"""The on-disk cache layout and the index format (see cache_layout.md).

Core module: standard library only. The build side writes what this module
describes; the run side and `verify` read it. Reading validates everything it
returns: a malformed, foreign or newer-layout index raises, and a path in it
that would leave the cache directory raises, before anything is opened.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from . import knobs
from .errors import CacheError, IntegrityError

# 2: index records are slim (no key_inputs; top-level tvm_ffi), compact JSON.
LAYOUT_VERSION = 2
INDEX_FORMAT = "cutlass-aot-index"
INDEX_NAME = "index.json"
ENTRIES_DIR = "entries"
RUNTIME_DIR = "runtime"
LOCKS_DIR = "locks"
TMP_DIR = "tmp"
ENTRY_RECORD = "entry.json"
ARTIFACT_NAME = "kernel.so"
RUNTIME_LIB_NAME = "libcute_dsl_runtime.so"

# The calling convention of GEMM artifacts, recorded per entry. The run side
# uses an entry only if it knows its ABI.
GEMM_ABI = "cutlass-aot-gemm-v1"
# Split-K variants take a scratch workspace and a split count (see
# signature.gemm_abi_args); a run side that predates them must not call them.
# v2: the data-parallel + split-K hybrid, whose workspace holds only the last
# wave's split tiles (signature.splitk_workspace_elems takes the SM count).
# A v1 artifact splits every tile and would write past a v2-sized workspace,
# so this run side refuses v1 entries (they are not in GEMM_ABIS).
# v3: splits = 0 asks for stream-K (the last wave's k-blocks dealt evenly to
# the SMs; signature.streamk_plan). A v2 artifact reads 0 as "no tail work"
# and would leave the last wave's tiles unwritten, so v2 is refused too.
GEMM_SPLITK_ABI = "cutlass-aot-gemm-splitk-v3"
GEMM_ABIS = (GEMM_ABI, GEMM_SPLITK_ABI)

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA_RE = _KEY_RE

BUILD_HINT = "run `cutlass-aot build` (or `cutlass-aot build configs/<arch>.yaml`)"


def is_sha256(text: object) -> bool:
    """Whether ``text`` is a hex sha256 as the cache writes it (64 lowercase
    hex digits, nothing else): content keys, artifact digests."""
    return isinstance(text, str) and _SHA_RE.fullmatch(text) is not None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (entries, runtime libraries)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def index_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / INDEX_NAME


def entry_dir(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / ENTRIES_DIR / key


def empty_index() -> dict:
    return {
        "format": INDEX_FORMAT,
        "layout": LAYOUT_VERSION,
        "generation": 0,
        "runtimes": {},
        "entries": {},
    }


def resolve_inside(cache_dir: Path, rel: str) -> Path:
    """Join a relative path from the index to the cache dir, refusing escapes.

    Absolute paths, '..' components and symlinks that resolve outside the
    cache directory are all refused: an index must not be able to point the
    loader at a library elsewhere on the machine.
    """
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        raise IntegrityError(
            f"index path {rel!r} is not a relative path inside the cache",
            path=rel,
        )
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise IntegrityError(f"index path {rel!r} escapes the cache directory", path=rel)
    root = Path(cache_dir).resolve()
    full = (root / rel).resolve()
    if root not in full.parents:
        raise IntegrityError(
            f"index path {rel!r} resolves to {full}, outside the cache {root}",
            path=rel,
        )
    return full


def read_index(cache_dir: Path, *, missing_ok: bool = True) -> dict:
    """Read and validate the index; an absent index is an empty cache."""
    path = index_path(cache_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return empty_index()
        if not Path(cache_dir).is_dir():  # a typo in the path is not an empty cache
            raise CacheError(
                f"no cache directory at {cache_dir}: it does not exist; check the path "
                f"(--cache-dir, CUTLASS_AOT_CACHE_DIR), or {BUILD_HINT}",
                cache_dir=str(cache_dir),
            ) from None
        raise CacheError(
            f"no cutlass-aot index at {path}: the cache is empty; {BUILD_HINT}",
            cache_dir=str(cache_dir),
        ) from None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise CacheError(
            f"cannot read the cache index {path} ({type(exc).__name__}: {exc.strerror or exc}); "
            "it must be a file this user can read: fix its permissions, or move it away and run "
            "`cutlass-aot verify --repair` to rebuild it from the entries",
            cache_dir=str(cache_dir), path=str(path),
        ) from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, huge ints
        raise IntegrityError(
            f"cache index {path} is not valid JSON ({exc}); it is truncated or "
            f"corrupt: run `cutlass-aot verify --repair` or rebuild ({BUILD_HINT})",
            path=str(path),
        ) from None
    validate_index(data, path)
    return data


def validate_index(data: Any, path: Path) -> None:
    """Raise CacheError/IntegrityError unless ``data`` is a layout-1 index."""
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise CacheError(
            f"{path} is not a cutlass-aot index (format field missing or foreign); "
            "point --cache-dir at a cutlass-aot cache",
            path=str(path),
        )
    if type(data.get("layout")) is not int:  # our index, a corrupt field: repairable
        raise IntegrityError(
            f"{path}: 'layout' is {data.get('layout')!r}, not a layout version number; the index "
            f"is corrupt: run `cutlass-aot verify --repair` or rebuild ({BUILD_HINT})",
            path=str(path), layout=data.get("layout"),
        )
    if data["layout"] != LAYOUT_VERSION:
        raise CacheError(
            f"{path} has cache layout {data.get('layout')!r}; this cutlass-aot "
            f"reads layout {LAYOUT_VERSION}: rebuild the cache with this version "
            f"({BUILD_HINT}) or use the cutlass-aot that wrote it",
            path=str(path),
            layout=data.get("layout"),
        )
    entries = data.get("entries")
    runtimes = data.get("runtimes")
    if not isinstance(entries, dict) or not isinstance(runtimes, dict):
        raise IntegrityError(f"{path}: 'entries'/'runtimes' must be objects", path=str(path))
    if "generation" in data and not _count(data["generation"]):
        raise IntegrityError(f"{path}: 'generation' is {data['generation']!r}, not a count of index "
                             "writes; run `cutlass-aot verify --repair`", path=str(path))
    for key, rec in entries.items():
        _check_entry(key, rec, path)
    for version, rec in runtimes.items():
        if not isinstance(rec, dict) or not _SHA_RE.match(str(rec.get("sha256", ""))) \
                or not _count(rec.get("size")):
            raise IntegrityError(
                f"{path}: runtime record {version!r} is malformed", path=str(path)
            )
        where = rec.get("path")
        if rec["sha256"] != version or (
                where is not None and where != f"{RUNTIME_DIR}/{version}/{RUNTIME_LIB_NAME}"):
            raise IntegrityError(
                f"{path}: runtime record {str(version)[:16]} names sha256 {rec['sha256'][:16]} and "
                f"path {where!r}; a bundled runtime lives at {RUNTIME_DIR}/<its sha256>/"
                f"{RUNTIME_LIB_NAME}", path=str(path))
    tables = data.get("tables", {})
    if not isinstance(tables, dict):
        raise IntegrityError(f"{path}: 'tables' must be an object", path=str(path))
    for gpu, rec in tables.items():
        ident = rec.get("gpu") if isinstance(rec, dict) else None
        if not (isinstance(rec, dict) and _SHA_RE.match(str(rec.get("sha256", "")))
                and isinstance(rec.get("path"), str) and _count(rec.get("size"))
                and isinstance(ident, dict) and isinstance(ident.get("name"), str)
                and _count(ident.get("sm_count")) and isinstance(ident.get("capability"), str)
                and ("rows" not in rec or _count(rec["rows"]))):
            raise IntegrityError(f"{path}: selection table record {gpu!r} is malformed",
                                 path=str(path))
    for section, name, rec in file_records(data):
        problem = file_record_problem(section, rec)
        if problem:
            where = f"{section}/{name}" if name is not None else section
            raise IntegrityError(f"{path}: file record {where!r}: {problem}", path=str(path),
                                 section=section)


# Index sections with their own rules; any other section whose records have
# a path and a sha256 lists extra files that travel with the cache (the
# selection tables: builder/merge.py moves them).
CORE_SECTIONS = frozenset({"format", "layout", "generation", "entries", "runtimes"})
# Directories an extra file may not live in: entries, runtimes, locks and
# scratch belong to the store (a section of these names is refused).
_RESERVED_DIRS = frozenset({ENTRIES_DIR, RUNTIME_DIR, LOCKS_DIR, TMP_DIR, INDEX_NAME})
_EXTRA_NAME_RE = re.compile(r"^([0-9a-f]{64})(\.[a-z0-9]{1,16})?$")


def _looks_like_file(rec: Any) -> bool:
    return isinstance(rec, dict) and "path" in rec and "sha256" in rec


def file_records(index: dict) -> list[tuple[str, str | None, dict]]:
    """Every record outside the core sections that names a file: (section,
    name, record). A section that is itself a record ``{"path", "sha256",
    ...}`` gives name None; a section that maps names to such records gives
    one item per name. Checked by ``file_record_problem`` when the index is
    read; builder/merge.py's ``extra_files`` moves the bundled ones."""
    found: list[tuple[str, str | None, dict]] = []
    for section, value in sorted(index.items()):
        if section in CORE_SECTIONS or not isinstance(value, dict):
            continue
        if _looks_like_file(value):
            found.append((section, None, value))
            continue
        for name, rec in sorted(value.items()):
            if _looks_like_file(rec):
                found.append((section, name, rec))
    return found


def file_record_problem(section: str, rec: dict) -> str | None:
    """What is wrong with an extra file's record, or None.

    Extra files are content-addressed: a bundled one lives at
    ``<section>/<its sha256>[.ext]``, so publishing one can only ever write
    the same bytes over a path, never replace a file another record (an
    entry, a runtime, the index) owns. Its size, when given, is a count of
    bytes. A record whose path is null is not bundled (nothing to place).
    """
    sha, size, where = rec.get("sha256"), rec.get("size"), rec.get("path")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        return "sha256 is not 64 lowercase hex digits"
    if "size" in rec and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        return f"size {size!r} is not a count of bytes"
    if where is None:
        return None
    if not isinstance(where, str):
        return f"path {where!r} is not a string"
    if section in _RESERVED_DIRS:
        return f"section {section!r} is a name the cache reserves for its own files"
    head, _, name = where.partition("/")
    match = _EXTRA_NAME_RE.match(name)
    if head != section or match is None or match.group(1) != sha:
        return (f"path {where!r} is not {section}/<its sha256>[.ext]: extra files are "
                "content-addressed")
    return None


# Fields of an index record. The entry's own entry.json holds the same record
# plus "key_inputs" (everything its key was computed from); the index leaves
# that out so that opening a cache of thousands of entries stays fast, and
# carries the one key input the run side checks, "tvm_ffi", at top level.
_ENTRY_FIELDS = {
    "key": str,
    "path": str,
    "symbol": str,
    "abi": str,
    "family": str,
    "signature": dict,
    "variant": dict,
    "tvm_ffi": str,
    "sha256": str,
    "size": int,
    "runtime": str,
    "built_at": str,
    "build_seconds": (int, float),
}


def _count(value: Any) -> bool:
    """Whether ``value`` is a non-negative int (and not a bool)."""
    return type(value) is int and value >= 0


def _check_entry(key: Any, rec: Any, path: Path) -> None:
    problem = _entry_problem(key, rec)
    if problem:
        raise IntegrityError(f"{path}: entry {str(key)[:16]}: {problem}", path=str(path),
                             key=key if isinstance(key, str) else None)


_FIELD_ITEMS = tuple(_ENTRY_FIELDS.items())


def _entry_problem(key: Any, rec: Any) -> str | None:
    """What is wrong with one index record, or None (runs once per entry at open)."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        return "key is not a sha256 hex digest"
    if not isinstance(rec, dict):
        return "record is not an object"
    for name, typ in _FIELD_ITEMS:
        value = rec.get(name)
        if not isinstance(value, typ) or value.__class__ is bool:
            return f"field {name!r} missing or not {getattr(typ, '__name__', typ)}"
    if rec["key"] != key or not _SHA_RE.match(rec["sha256"]):
        return "key/sha256 fields are inconsistent"
    if rec["path"] != f"{ENTRIES_DIR}/{key}/{ARTIFACT_NAME}":
        # the store places every artifact there (stage_entry); an index
        # that says otherwise points readers at another entry's file
        return f"path {rec['path']!r} is not {ENTRIES_DIR}/<key>/{ARTIFACT_NAME}"
    return _nested_problem(rec)


def _nested_problem(rec: dict) -> str | None:
    """What is wrong inside a record's nested fields, or None.

    Readers index these fields directly, so a hand-edited or truncated record
    must fail here, as an IntegrityError, not as a KeyError later.
    """
    sig = rec["signature"]
    if not (isinstance(sig.get("op"), str) and isinstance(sig.get("arch"), str)
            and isinstance(sig.get("fields"), dict)):
        return "signature needs str 'op', str 'arch' and an object 'fields'"
    for name, value in sig["fields"].items():
        if value is not None and not isinstance(value, (str, int, bool)):
            return f"signature field {name!r} is not a scalar"
    for name, value in rec["variant"].items():
        if value is not None and not isinstance(value, (str, int, bool)):
            return f"variant parameter {name!r} is not a scalar"
    if not isinstance(rec.get("signature_text", ""), str):  # optional; readers sort and print it
        return "signature_text is not a string"
    if not _SHA_RE.match(rec["runtime"]):
        return "runtime is not a sha256 hex digest"
    if rec["size"] < 0:
        return "size is negative"
    try:  # gc compares it with the clock: it must say its zone
        if _dt.datetime.fromisoformat(rec["built_at"]).tzinfo is None:
            return f"built_at {rec['built_at']!r} has no time zone"
    except ValueError:
        return f"built_at {rec['built_at']!r} is not an ISO 8601 time"
    return None


def check_trusted_dir(cache_dir: Path) -> None:
    """Refuse a cache a stranger could have written to.

    The loader dlopens code from the cache, so the directory, its index and
    its entries directory must not be world-writable (sticky or not), and must
    be owned by this user or by root (a container image built as root and run
    as a service user is the common, safe case). CUTLASS_AOT_TRUST_ANY_OWNER=1
    lifts the ownership rule only.
    """
    check_trusted_paths(cache_dir, [Path(cache_dir), index_path(cache_dir), Path(cache_dir) / ENTRIES_DIR])


def check_trusted_paths(cache_dir: Path, paths: list[Path]) -> None:
    """The trust rule of check_trusted_dir, for more paths of the cache.

    The loader applies it to ``entries/<key>/`` before loading an entry and to
    ``runtime/`` and ``runtime/<sha>/`` before using a bundled runtime.
    """
    uid = os.geteuid()
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if st.st_mode & stat.S_IWOTH:
            raise CacheError(
                f"refusing cache {cache_dir}: {p} is world-writable, so any user "
                f"could plant code that this process would load; run `chmod o-w {p}`",
                cache_dir=str(cache_dir),
                path=str(p),
            )
        if st.st_uid not in (uid, 0) and not knobs.trust_any_owner():
            raise CacheError(
                f"refusing cache {cache_dir}: {p} is owned by uid {st.st_uid}, not by "
                f"this user ({uid}) or root; chown it, or set "
                "CUTLASS_AOT_TRUST_ANY_OWNER=1 if that owner is trusted",
                cache_dir=str(cache_dir),
                path=str(p),
            )


def index_record(entry_record: dict) -> dict:
    """The index's slim copy of an entry.json record (see _ENTRY_FIELDS)."""
    rec = {k: v for k, v in entry_record.items() if k != "key_inputs"}
    rec["tvm_ffi"] = entry_record["key_inputs"]["toolchain"]["tvm_ffi"]
    return rec


def table_slot(gpu: dict) -> str:
    """The index's name for the selection table of one GPU."""
    return f"{gpu['name']}|{gpu['sm_count']}|{gpu['capability']}"


def dumps_index(data: dict) -> bytes:
    # Compact: the index is read by every service at start; `cutlass-aot ls`
    # is the human view.
    return (json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n").encode()
