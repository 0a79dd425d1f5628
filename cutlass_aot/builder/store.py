"""Store: publish built artifacts into the cache, atomically; verify; gc.

Build side; the only code that writes a cache. Protocol (cache_layout.md):

1. a build works in a private dir under ``tmp/`` (same filesystem);
2. holding the key's lock, it writes ``entry.json`` into that dir and renames
   the dir to ``entries/<key>`` (a corrupt or orphaned old dir is first
   renamed away, never rewritten in place);
3. holding the index lock, it rewrites ``index.json`` with the new record
   (temp file, fsync, ``os.replace``). The index is the commit marker:
   readers use only entries it lists, so a crash at any point leaves either
   the old index or the new one, never a half-visible entry.

Locks are filelock (flock) files under ``locks/``: the kernel drops them when
a process dies, so a killed build never blocks the next. Readers take none.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .. import knobs
from ..errors import CacheError, IntegrityError
from ..layout import (
    ARTIFACT_NAME,
    ENTRIES_DIR,
    ENTRY_RECORD,
    LAYOUT_VERSION,
    LOCKS_DIR,
    RUNTIME_DIR,
    RUNTIME_LIB_NAME,
    TMP_DIR,
    _check_entry,
    dumps_index,
    empty_index,
    entry_dir,
    index_path,
    index_record,
    read_index,
    resolve_inside,
    sha256_file,
    table_slot,
)
from ..tables import TABLES_DIR, dumps_table, merge_rows, schedule_of, validate_table


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


class CacheStore:
    """A writable cache directory."""

    def __init__(self, root: Path):
        self.root = Path(root)

    # ---------------------------------------------------------------- setup
    def ensure(self) -> None:
        try:
            for sub in (ENTRIES_DIR, LOCKS_DIR, TMP_DIR, RUNTIME_DIR):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create cache directory {self.root} ({exc.strerror}); "
                "pass a writable --cache-dir or set CUTLASS_AOT_CACHE_DIR",
                cache_dir=str(self.root),
            ) from None
        if not os.access(self.root, os.W_OK):
            raise CacheError(
                f"cache directory {self.root} is not writable; a read-only cache can "
                "be loaded but not built into: pass a writable --cache-dir",
                cache_dir=str(self.root),
            )

    def init_index(self) -> None:
        """Write an empty index if there is none, so the dir reads as a cache."""
        if not index_path(self.root).exists():
            with self._locked_index():
                if not index_path(self.root).exists():
                    index, _ = self.load_index()
                    _fsync_write(index_path(self.root), dumps_index(index))

    def sweep_tmp(self, older_than_s: float) -> int:
        """Remove work dirs a killed build left in tmp/; returns bytes freed.

        Live builds keep their work dirs only for one compile, so an age of an
        hour or more is never one in use.
        """
        import time  # noqa: PLC0415

        freed, now = 0, time.time()
        for d in (self.root / TMP_DIR).iterdir() if (self.root / TMP_DIR).is_dir() else ():
            try:
                if now - d.lstat().st_mtime > older_than_s:
                    freed += _tree_bytes(d)
                    if d.is_dir() and not d.is_symlink():
                        shutil.rmtree(d, ignore_errors=True)
                    else:
                        d.unlink()
            except OSError:
                continue
        return freed

    def tmp_dir(self) -> str:
        return str(self.root / TMP_DIR)

    def key_lock(self, key: str) -> FileLock:
        return FileLock(str(self.root / LOCKS_DIR / f"{key}.lock"), timeout=knobs.lock_timeout())

    def index_lock(self) -> FileLock:
        return FileLock(str(self.root / LOCKS_DIR / "index.lock"), timeout=knobs.lock_timeout())

    # ---------------------------------------------------------------- index
    def load_index(self) -> tuple[dict, list[str]]:
        """The index, or one rebuilt from entry records if it is corrupt.

        Returns (index, notes); notes say what was repaired.
        """
        try:
            index = read_index(self.root)
        except CacheError as exc:
            older = isinstance(exc.data.get("layout"), int) and exc.data["layout"] < LAYOUT_VERSION
            if not isinstance(exc, IntegrityError) and not older:
                raise  # foreign, or written by a newer cutlass-aot: not ours to rewrite
            index, notes = self.scan_entries()
            what = (f"index of layout {exc.data['layout']} is migrated to layout {LAYOUT_VERSION}"
                    if older else f"index was unreadable ({exc.message.split(';')[0]})")
            return index, [f"{what}; rebuilt from {len(index['entries'])} entry records"] + notes
        if not index_path(self.root).exists() and any((self.root / ENTRIES_DIR).glob("*/" + ENTRY_RECORD)):
            index, notes = self.scan_entries()
            return index, [f"index was missing; rebuilt from {len(index['entries'])} entry records"] + notes
        return index, []

    def scan_entries(self) -> tuple[dict, list[str]]:
        """Rebuild an index from entries/*/entry.json, keeping verified ones."""
        index = empty_index()
        notes: list[str] = []
        base = self.root / ENTRIES_DIR
        for d in sorted(base.iterdir()) if base.is_dir() else []:
            rec_path = d / ENTRY_RECORD
            try:
                rec = index_record(json.loads(rec_path.read_bytes()))
                _check_entry(d.name, rec, rec_path)
                lib = resolve_inside(self.root, rec["path"])
                if sha256_file(lib) != rec["sha256"]:
                    raise IntegrityError("sha256 mismatch")
            except (OSError, ValueError, KeyError, TypeError, IntegrityError) as exc:
                notes.append(f"dropped entry {d.name[:16]}: {type(exc).__name__}: {exc}")
                continue
            index["entries"][d.name] = rec
        for rt in sorted((self.root / RUNTIME_DIR).glob(f"*/{RUNTIME_LIB_NAME}")):
            sha = rt.parent.name
            if len(sha) == 64 and sha256_file(rt) == sha:
                index["runtimes"][sha] = {
                    "path": f"{RUNTIME_DIR}/{sha}/{RUNTIME_LIB_NAME}",
                    "sha256": sha,
                    "size": rt.stat().st_size,
                    "source": "rescanned",
                }
        return index, notes

    def update_index(self, mutate: Callable[[dict], None]) -> dict:
        """Read-modify-write the index under the index lock."""
        with self._locked_index():
            index, _ = self.load_index()
            mutate(index)
            index["generation"] = int(index.get("generation", 0)) + 1
            _fsync_write(index_path(self.root), dumps_index(index))
            return index

    @contextlib.contextmanager
    def _locked_index(self):
        lock = self.index_lock()
        try:
            lock.acquire()
        except Timeout:
            raise CacheError(
                f"timed out after {lock.timeout:.0f}s waiting for {lock.lock_file}: another "
                "cutlass-aot process holds the index lock; retry, or raise "
                "CUTLASS_AOT_LOCK_TIMEOUT", cache_dir=str(self.root)) from None
        try:
            yield
        finally:
            lock.release()

    def entry_ok(self, index: dict, key: str) -> bool:
        """The entry is listed and its file has the recorded size and hash."""
        rec = index["entries"].get(key)
        if rec is None:
            return False
        try:
            lib = resolve_inside(self.root, rec["path"])
            return lib.stat().st_size == rec["size"] and sha256_file(lib) == rec["sha256"]
        except (OSError, IntegrityError):
            return False

    # -------------------------------------------------------------- runtime
    def ensure_runtime(self, lib_path: str | None, bundle: bool) -> dict[str, Any]:
        """Record the CuTe DSL runtime library; copy it in when bundling."""
        if lib_path is None:
            raise CacheError(
                "libcute_dsl_runtime.so was not found in the installed nvidia-cutlass-dsl; "
                "reinstall it (pip install nvidia-cutlass-dsl)"
            )
        sha = sha256_file(Path(lib_path))
        rec: dict[str, Any] = {
            "sha256": sha,
            "size": Path(lib_path).stat().st_size,
            "source": os.path.basename(os.path.dirname(os.path.dirname(lib_path))),
            "path": None,
        }
        if bundle:
            rel = f"{RUNTIME_DIR}/{sha}/{RUNTIME_LIB_NAME}"
            dest = self.root / rel
            if not (dest.is_file() and sha256_file(dest) == sha):
                work = Path(tempfile.mkdtemp(prefix="runtime-", dir=self.tmp_dir()))
                shutil.copyfile(lib_path, work / RUNTIME_LIB_NAME)
                _publishable(work)
                target = dest.parent
                if target.exists():
                    self._discard(target)
                try:
                    os.rename(work, target)
                except OSError:
                    # another builder published it first; theirs is identical
                    shutil.rmtree(work, ignore_errors=True)
            rec["path"] = rel
        return rec

    # -------------------------------------------------------------- publish
    def publish(self, key: str, build_dir: str, record: dict, runtime: dict) -> dict:
        """Move a finished build into place and commit it to the index.

        The caller holds the key lock.
        """
        record = dict(record)
        lib = Path(build_dir) / ARTIFACT_NAME
        record["sha256"] = sha256_file(lib)
        record["size"] = lib.stat().st_size
        record["path"] = f"{ENTRIES_DIR}/{key}/{ARTIFACT_NAME}"
        record["built_at"] = _now()
        record["runtime"] = runtime["sha256"]
        (Path(build_dir) / ENTRY_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
        _check_entry(key, index_record(record), Path(build_dir) / ENTRY_RECORD)
        _publishable(Path(build_dir))
        target = entry_dir(self.root, key)
        if target.exists():
            self._discard(target)
        os.rename(build_dir, target)

        slim = index_record(record)

        def add(index: dict) -> None:
            index["entries"][key] = slim
            index["runtimes"][runtime["sha256"]] = runtime

        self.update_index(add)
        return record

    def _discard(self, path: Path) -> None:
        trash = self.root / TMP_DIR / f"trash-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # --------------------------------------------------------------- verify
    def verify(self, repair: bool = False) -> dict[str, Any]:
        """Re-hash every entry and runtime; optionally drop what is bad."""
        problems: list[dict[str, str]] = []
        try:
            index = read_index(self.root, missing_ok=True)
        except IntegrityError as exc:
            problems.append({"what": "index", "problem": exc.message})
            index, _ = self.scan_entries()
            if repair:
                self.update_index(lambda idx: idx.update(entries=index["entries"], runtimes=index["runtimes"]))
            return {"checked": len(index["entries"]), "problems": problems, "repaired": repair}
        bad: list[str] = []
        for key, rec in sorted(index["entries"].items()):
            try:
                lib = resolve_inside(self.root, rec["path"])
                actual = sha256_file(lib)
            except FileNotFoundError:
                problems.append({"what": key, "problem": f"artifact {rec['path']} is missing"})
                bad.append(key)
                continue
            except (OSError, IntegrityError) as exc:
                problems.append({"what": key, "problem": str(exc)})
                bad.append(key)
                continue
            if actual != rec["sha256"]:
                problems.append({
                    "what": key,
                    "problem": f"sha256 of {rec['path']} is {actual[:16]}..., "
                               f"index records {rec['sha256'][:16]}...",
                })
                bad.append(key)
        for sha, rec in sorted(index["runtimes"].items()):
            if rec.get("path") is None:
                continue
            try:
                ok = sha256_file(resolve_inside(self.root, rec["path"])) == sha
            except (OSError, IntegrityError):
                ok = False
            if not ok:
                problems.append({"what": f"runtime {sha[:16]}", "problem": "missing or altered"})
        if repair and bad:
            def drop(idx: dict) -> None:
                for key in bad:
                    idx["entries"].pop(key, None)

            self.update_index(drop)
            for key in bad:
                self._discard(entry_dir(self.root, key))
        return {"checked": len(index["entries"]), "problems": problems, "repaired": repair and bool(bad)}

    # ------------------------------------------------------------------- gc
    def gc(self, keep: set[str] | None, older_than_s: float | None) -> dict[str, Any]:
        """Remove entries not in ``keep`` (if given) or older than the age."""
        now = _dt.datetime.now(_dt.UTC)
        removed: list[str] = []
        freed = 0
        with self._locked_index():
            index, _ = self.load_index()
            for key, rec in list(index["entries"].items()):
                stale = keep is not None and key not in keep
                if older_than_s is not None:
                    try:
                        built = _dt.datetime.fromisoformat(rec["built_at"])
                        stale = stale or (now - built).total_seconds() > older_than_s
                    except ValueError:
                        stale = True
                if stale:
                    removed.append(key)
                    del index["entries"][key]
            used = {rec["runtime"] for rec in index["entries"].values()}
            dead_runtimes = [sha for sha in index["runtimes"] if sha not in used]
            for sha in dead_runtimes:
                del index["runtimes"][sha]
            index["generation"] = int(index.get("generation", 0)) + 1
            _fsync_write(index_path(self.root), dumps_index(index))
        # Files go only after the index no longer lists them.
        for key in removed:
            freed += _tree_bytes(entry_dir(self.root, key))
            self._discard(entry_dir(self.root, key))
        for sha in dead_runtimes:
            d = self.root / RUNTIME_DIR / sha
            freed += _tree_bytes(d)
            self._discard(d)
        # Orphans: entry dirs no index lists (a build killed between rename and
        # index update). Only those whose key lock is free are ours to remove.
        listed = set(index["entries"])
        for d in sorted((self.root / ENTRIES_DIR).iterdir()):
            if d.name in listed:
                continue
            lock = FileLock(str(self.root / LOCKS_DIR / f"{d.name}.lock"), timeout=0)
            try:
                with lock:
                    freed += _tree_bytes(d)
                    self._discard(d)
                    removed.append(d.name)
            except Timeout:
                continue
        freed += self.sweep_tmp(older_than_s=3600)
        return {"removed": len(removed), "bytes_freed": freed, "kept": len(listed)}


    # ---------------------------------------------------- selection tables
    def publish_table(self, doc: dict, merge: bool = False) -> dict[str, Any]:
        """Publish a selection table: ``tables/<sha256>.json``, then the index.

        One table per GPU kind (its slot); a new table for a slot replaces
        the old one in the same index commit, and the old file goes after.
        Readers of the old index that find its file gone fall back to the
        model, never to a wrong table. ``merge``: keep the old table's rows
        for problems the new one did not measure.
        """
        validate_table(doc, "table to publish")
        if merge:
            doc = dict(doc, rows=merge_rows(self.table_rows(doc["gpu"]), doc["rows"]))
        data = dumps_table(doc)
        sha = hashlib.sha256(data).hexdigest()
        rel = f"{TABLES_DIR}/{sha}.json"
        (self.root / TABLES_DIR).mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="table-", dir=self.tmp_dir())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.root / rel)
        slot = table_slot(doc["gpu"])
        record = {"path": rel, "sha256": sha, "size": len(data), "gpu": doc["gpu"],
                  "rows": len(doc["rows"]), "published_at": _now()}
        replaced: list[str] = []

        def put(index: dict) -> None:
            old = index.setdefault("tables", {}).get(slot)
            if old and old["path"] != rel:
                replaced.append(old["path"])
            index["tables"][slot] = record

        self.update_index(put)
        for old_rel in replaced:
            with contextlib.suppress(OSError, IntegrityError):
                resolve_inside(self.root, old_rel).unlink()
        return record

    def table_rows(self, gpu: dict) -> list[dict]:
        """Rows of the cache's table for a GPU ([] if none or unreadable)."""
        rec = read_index(self.root, missing_ok=True).get("tables", {}).get(table_slot(gpu))
        if not rec:
            return []
        try:
            old = json.loads(resolve_inside(self.root, rec["path"]).read_bytes())
            validate_table(old, rec["path"])
        except (OSError, ValueError, IntegrityError):
            return []
        return old["rows"]

    def prune_tables(self) -> dict[str, int]:
        """Drop table rows whose variant the index no longer lists (gc)."""
        index = read_index(self.root, missing_ok=True)
        dropped: dict[str, int] = {}
        have = {(r.get("signature_text"), r["family"], schedule_of(r["variant"]))
                for r in index["entries"].values()}
        for slot, rec in list(index.get("tables", {}).items()):
            try:
                doc = json.loads(resolve_inside(self.root, rec["path"]).read_bytes())
                validate_table(doc, rec["path"])
            except (OSError, ValueError, IntegrityError):
                continue  # verify reports it; gc does not guess
            keep = [r for r in doc["rows"]
                    if (r["signature"], r["family"], schedule_of(r["variant"])) in have]
            if len(keep) != len(doc["rows"]):
                dropped[slot] = len(doc["rows"]) - len(keep)
                self.publish_table(dict(doc, rows=keep))
        return dropped


def _publishable(path: Path) -> None:
    """Give a private build dir the modes of a published entry.

    mkdtemp makes 0700 dirs; a cache built as root (a container image) must
    be readable by the service user that loads it. Nothing is made writable
    for others: the loader refuses world-writable caches.
    """
    os.chmod(path, 0o755)
    for child in path.iterdir():
        os.chmod(child, 0o644 if child.is_file() else 0o755)


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
