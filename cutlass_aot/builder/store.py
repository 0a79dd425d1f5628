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

Deleting follows the same locks as publishing (``_remove_entries``): take the
key's lock, then the index lock, re-read the index, decide from what it says
*now*, write the index, and only then delete the directory (and its lock
file) while still holding the key's lock. ``gc`` and ``verify --repair`` both
go through it, so neither can remove an entry a concurrent build has just
committed. Runtime directories are created and deleted only under the index
lock, and a publish re-creates its runtime if a concurrent ``gc`` removed it.
Every write of ``index.json`` goes through ``_write_index``.

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
import stat
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .. import knobs
from ..errors import CacheError, CutlassAotError, IntegrityError, UsageError
from ..keys import content_key
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
    is_sha256,
    read_index,
    resolve_inside,
    sha256_file,
    table_slot,
)
from ..signature import Signature
from ..tables import TABLES_DIR, dumps_table, merge_rows, parse_table_bytes, schedule_of, validate_table

# How many key locks one deletion batch holds at once (each is an open fd).
_LOCK_BATCH = 64
# What opening a lock file raises when something else is in its place (a
# directory named like the lock, a file named locks/): CacheErrors that say so.
_LOCK_PATH_ERRORS = (IsADirectoryError, NotADirectoryError, FileExistsError)

# What writers create in tmp/, and so all that sweep_tmp may remove there:
# compile work dirs (compile.py), runtime copies, staged merge/pull entries,
# extra files and tables being placed, trash of replaced dirs (this module),
# pull downloads and each pull's own links to them (remote/pull.py:
# pull-<sha>.part/.blob, pull-<sha>.<pid>-<hex>.own) and tune journals
# (tune/tuner.py: tune-journal-*.jsonl). A writer that adds a name adds it here.
TMP_PREFIXES = ("build-", "runtime-", "adopt-", "file-", "table-", "trash-", "pull-", "tune-journal-")


def trace(event: str, **data: Any) -> None:
    """Append one line to $CUTLASS_AOT_TRACE_FILE, if set: where a build is.

    The kill campaign (tests/reliability/test_crash.py) reads it to tell
    kills that landed mid-compile, mid-publish and mid-index-write apart.
    """
    path = knobs.trace_file()  # UsageError: a directory, or no such directory
    if not path:
        return
    import time  # noqa: PLC0415

    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **data}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"{knobs.PREFIX}TRACE_FILE={path!r}: cannot append to it ({exc.strerror}); "
                         "point it at a writable file, or unset it", knob=knobs.PREFIX + "TRACE_FILE",
                         value=path) from None
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _fsync_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably, mode 0644 whatever
    the umask: a service user other than the builder must read the index."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def check_record(key: str, rec: dict, entry_json: bytes) -> dict:
    """The full record from entry.json bytes, checked against its index record.

    Raises IntegrityError unless the bytes parse, their slim form equals the
    index record, the key is the content hash of their key_inputs, and the
    record's ``signature_text`` (if any) is the text of its ``signature``.
    The index is what the loader trusts, and only entry.json is bound to the
    key: a hand-edited index record that disagrees with it would send calls
    to an artifact built for another signature.
    """
    try:
        full = json.loads(entry_json)
        slim = index_record(full)
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"entry {key[:16]}: entry.json is unreadable ({exc})", key=key) from None
    if slim != rec:
        diff = sorted(k for k in set(slim) | set(rec) if slim.get(k) != rec.get(k))
        raise IntegrityError(f"entry {key[:16]}: entry.json disagrees with the index on {diff}", key=key)
    try:
        actual = content_key(full["key_inputs"])
    except (CutlassAotError, TypeError, ValueError) as exc:
        raise IntegrityError(f"entry {key[:16]}: key_inputs cannot be hashed ({exc})", key=key) from None
    if actual != key:
        raise IntegrityError(
            f"entry {key[:16]}: its key_inputs hash to {actual[:16]}..., not to its key", key=key)
    text = rec.get("signature_text")
    if text is not None:
        try:
            sig_text = Signature.from_dict(rec["signature"]).text()
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"entry {key[:16]}: its signature is malformed ({exc})", key=key) from None
        if text != sig_text:
            raise IntegrityError(f"entry {key[:16]}: signature_text {text!r} is not its signature's "
                                 f"text {sig_text!r}", key=key)
    return full


class CacheStore:
    """A writable cache directory."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._runtime_sources: dict[str, str] = {}  # runtime sha -> the library it came from

    # ---------------------------------------------------------------- setup
    def ensure(self) -> None:
        self.require_writable()
        try:
            # What this creates is 0755 whatever the umask (a cache built as
            # root is served by another user); what exists keeps its modes.
            for path in (self.root, *(self.root / sub for sub in (ENTRIES_DIR, LOCKS_DIR, TMP_DIR, RUNTIME_DIR))):
                if not path.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    os.chmod(path, 0o755)
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
        self._require_local_tmp()

    def _require_local_tmp(self) -> None:
        """Refuse (CacheError) a ``tmp/`` that is a symlink or on another
        filesystem than the cache: writers build in tmp/ and publish by
        rename, which cannot cross filesystems (EXDEV), and sweep_tmp never
        follows a link."""
        tmp = self.root / TMP_DIR
        try:
            st, root_st = os.lstat(tmp), os.stat(self.root)
        except OSError as exc:
            raise CacheError(f"cannot read {tmp} ({exc.strerror})", cache_dir=str(self.root),
                             path=str(tmp)) from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_dev != root_st.st_dev:
            what = ("a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                    if not stat.S_ISDIR(st.st_mode) else "on another filesystem than the cache")
            raise CacheError(
                f"{tmp} is {what}: builds work in tmp/ and publish into the cache by rename, so "
                "tmp/ must be a real directory on the cache's own filesystem; remove it (or "
                "unmount what is mounted there) and run the command again", cache_dir=str(self.root),
                path=str(tmp))

    def has_index(self) -> bool:
        return index_path(self.root).exists()

    def init_index(self) -> None:
        """Write an empty index if there is none (merge and pull of nothing still
        leave a cache that readers can open); through the one index writer."""
        if not self.has_index():
            self.update_index(lambda index: None)

    def require_writable(self) -> None:
        """Refuse (CacheError, exit 2) a cache this process cannot write, and
        one whose locks/, tmp/ or runtime/ is there but is not a directory
        (no writer could lock, stage or place anything in it). A file where
        entries/ belongs is left to ``verify --repair``, which drops what it
        cannot find."""
        for sub in (LOCKS_DIR, TMP_DIR, RUNTIME_DIR):
            d = self.root / sub
            if os.path.lexists(d) and not d.is_dir():
                raise CacheError(
                    f"{d} is not a directory: a cache keeps its {sub}/ there; remove it (no "
                    "cutlass-aot process makes anything else) and run the command again",
                    cache_dir=str(self.root), path=str(d))
        for sub in ("", ENTRIES_DIR, LOCKS_DIR, TMP_DIR, RUNTIME_DIR):
            d = self.root / sub
            if d.is_dir() and not os.access(d, os.W_OK | os.X_OK):
                raise CacheError(
                    f"cache directory {d} is not writable; a read-only cache can be "
                    "loaded but not changed: run this as the cache's owner, or on a "
                    "writable copy", cache_dir=str(self.root), path=str(d))

    def sweep_tmp(self, older_than_s: float) -> int:
        """Remove what killed writers left: work dirs in tmp/ and temp index
        files (``.index.json.*.tmp``) in the root; returns bytes freed.

        Live builds keep their work dirs only for one compile, and a temp
        index file only for one write, so an age of an hour or more is never
        one in use. Only names writers create (``TMP_PREFIXES``) are removed,
        and only in a ``tmp/`` that is a real directory: a ``tmp`` symlink
        (or anything else) is never followed, since what it points at is not
        the cache's to delete.
        """
        import time  # noqa: PLC0415

        freed, now = 0, time.time()
        tmp = self.root / TMP_DIR
        try:
            tmp_is_dir = stat.S_ISDIR(os.lstat(tmp).st_mode)
        except OSError:
            tmp_is_dir = False
        stale_index_tmps = list(self.root.glob(".index.json.*.tmp")) if self.root.is_dir() else []
        ours = [d for d in (tmp.iterdir() if tmp_is_dir else ()) if d.name.startswith(TMP_PREFIXES)]
        for d in [*ours, *stale_index_tmps]:
            try:
                st = d.lstat()
                if now - st.st_mtime > older_than_s:
                    if stat.S_ISDIR(st.st_mode):
                        freed += _tree_bytes(d)
                        shutil.rmtree(d, ignore_errors=True)
                    else:
                        freed += st.st_size if stat.S_ISREG(st.st_mode) else 0
                        d.unlink()
            except OSError:
                continue
        return freed

    def tmp_dir(self) -> str:
        return str(self.root / TMP_DIR)

    def key_lock(self, key: str) -> FileLock:
        return FileLock(str(self.root / LOCKS_DIR / f"{key}.lock"), timeout=knobs.lock_timeout())

    def acquire_key(self, key: str, timeout: float) -> FileLock | None:
        """The key's lock, acquired; None if another process holds it past timeout.

        gc unlinks the lock files of the keys it removes (while holding them);
        filelock notices an unlinked file after flock and retries on the new
        one, so two processes never both hold one key.
        """
        lock = self.key_lock(key)
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            return None
        except _LOCK_PATH_ERRORS as exc:
            raise self._lock_error(lock, exc) from None
        return lock

    def _lock_error(self, lock: FileLock, exc: OSError) -> CacheError:
        """A lock file that something else is in the place of (_LOCK_PATH_ERRORS), in words."""
        what = ("is a directory" if isinstance(exc, IsADirectoryError)
                else f"cannot be opened: {Path(lock.lock_file).parent} is not a directory ({exc.strerror or exc})")
        return CacheError(
            f"the lock {lock.lock_file} {what}; remove what is in its place (no cutlass-aot process "
            "makes one) and run the command again", cache_dir=str(self.root), path=lock.lock_file)

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
            layout = exc.data.get("layout")
            older = type(layout) is int and layout < LAYOUT_VERSION  # True is no layout
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
        """Rebuild an index from what is on disk, keeping what verifies.

        Entries from entries/*/entry.json whose artifacts match; runtimes
        from runtime/<sha>/ files that hash right, plus a bare record (path
        null, as ``--no-bundle-runtime`` writes) for every other runtime an
        entry names, so that no entry points at a runtime the index lacks;
        selection tables from tables/*.json files that parse and validate,
        one per GPU slot (the newest file where several claim one).
        """
        index = empty_index()
        notes: list[str] = []
        base = self.root / ENTRIES_DIR
        for d in sorted(base.iterdir()) if base.is_dir() else []:
            rec_path = d / ENTRY_RECORD
            try:
                raw = rec_path.read_bytes()
                rec = index_record(json.loads(raw))
                _check_entry(d.name, rec, rec_path)
                check_record(d.name, rec, raw)  # its key is the hash of its key_inputs
                lib = resolve_inside(self.root, rec["path"])
                if sha256_file(lib) != rec["sha256"]:
                    raise IntegrityError("sha256 mismatch")
            except (OSError, ValueError, KeyError, TypeError, IntegrityError) as exc:
                notes.append(f"dropped entry {d.name[:16]}: {type(exc).__name__}: {exc}")
                continue
            index["entries"][d.name] = rec
        for rt in sorted((self.root / RUNTIME_DIR).glob(f"*/{RUNTIME_LIB_NAME}")):
            sha = rt.parent.name
            with contextlib.suppress(OSError):
                if is_sha256(sha) and rt.is_file() and sha256_file(rt) == sha:
                    index["runtimes"][sha] = {
                        "path": f"{RUNTIME_DIR}/{sha}/{RUNTIME_LIB_NAME}",
                        "sha256": sha,
                        "size": rt.stat().st_size,
                        "source": "rescanned",
                    }
        for sha in sorted({rec["runtime"] for rec in index["entries"].values()} - set(index["runtimes"])):
            index["runtimes"][sha] = self._bare_runtime(sha)
        tables, table_notes = self._scan_tables()
        if tables:
            index["tables"] = tables
        return index, notes + table_notes

    def _bare_runtime(self, sha: str) -> dict[str, Any]:
        """A runtime record without a bundled file (``--no-bundle-runtime``),
        its size and source taken from an installed copy with that hash if
        there is one (else size 0: the record's size is informational)."""
        rec: dict[str, Any] = {"path": None, "sha256": sha, "size": 0, "source": "rescanned"}
        for lib in [self._runtime_sources.get(sha), *_installed_runtimes()]:
            with contextlib.suppress(OSError, TypeError):
                if lib and sha256_file(Path(lib)) == sha:
                    rec["size"] = Path(lib).stat().st_size
                    rec["source"] = Path(lib).parent.parent.name
                    break
        return rec

    def _scan_tables(self) -> tuple[dict[str, dict], list[str]]:
        """Table records rebuilt from tables/*.json: {slot: record}, notes."""
        found: dict[str, list[tuple[float, dict]]] = {}
        notes: list[str] = []
        base = self.root / TABLES_DIR
        for f in sorted(base.glob("*.json")) if base.is_dir() else []:
            rel = f"{TABLES_DIR}/{f.name}"
            try:
                data = f.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                if f.name != f"{sha}.json":
                    raise IntegrityError(f"its bytes hash to {sha[:16]}..., not to its name")
                doc = parse_table_bytes(data, rel)
                mtime = f.stat().st_mtime
            except (OSError, IntegrityError) as exc:
                notes.append(f"dropped selection table {rel}: {exc}")
                continue
            record = {"path": rel, "sha256": sha, "size": len(data), "gpu": doc["gpu"],
                      "rows": len(doc["rows"]),
                      "published_at": _dt.datetime.fromtimestamp(mtime, _dt.UTC).isoformat(timespec="seconds")}
            found.setdefault(table_slot(doc["gpu"]), []).append((mtime, record))
        tables: dict[str, dict] = {}
        for slot, recs in sorted(found.items()):
            recs.sort(key=lambda mr: (mr[0], mr[1]["path"]))
            tables[slot] = recs[-1][1]
            if len(recs) > 1:
                notes.append(f"{len(recs)} selection tables claim GPU {slot!r}; kept the newest, "
                             f"{recs[-1][1]['path']}; the others stay on disk unlisted ("
                             + ", ".join(r["path"] for _, r in recs[:-1]) + ")")
        return tables, notes

    def update_index(self, mutate: Callable[[dict], None]) -> dict:
        """Read-modify-write the index under the index lock.

        The index is re-read under the lock (and rebuilt from entry records if
        it is unreadable), so a mutation never works from a stale copy.
        """
        with self._locked_index():
            index, _ = self.load_index()
            mutate(index)
            self._write_index(index)
            return index

    def _write_index(self, index: dict) -> None:
        """The one writer of index.json; the caller holds the index lock."""
        index["generation"] = int(index.get("generation", 0)) + 1
        trace("index-write", generation=index["generation"])
        _fsync_write(index_path(self.root), dumps_index(index))
        trace("index-written", generation=index["generation"])

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
        except IsADirectoryError:
            raise CacheError(
                f"the index lock {lock.lock_file} is a directory; remove it (no cutlass-aot process "
                "makes one) and run the command again", cache_dir=str(self.root)) from None
        except _LOCK_PATH_ERRORS as exc:  # locks/ is a file
            raise self._lock_error(lock, exc) from None
        try:
            yield
        finally:
            lock.release()

    def entry_ok(self, index: dict, key: str) -> bool:
        """The entry is listed, its file has the recorded size and hash, and
        its entry.json agrees with the index record (``check_record``): an
        entry that fails is rebuilt or replaced, never counted as cached."""
        rec = index["entries"].get(key)
        return rec is not None and rec.get("key") == key and self._entry_problem(rec) is None

    # -------------------------------------------------------------- runtime
    def ensure_runtime(self, lib_path: str | None, bundle: bool) -> dict[str, Any]:
        """Record the CuTe DSL runtime library a build linked; copy it in when bundling."""
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
        self._runtime_sources[sha] = lib_path
        if bundle:
            rec["path"] = f"{RUNTIME_DIR}/{sha}/{RUNTIME_LIB_NAME}"
            with self._locked_index():
                self._bundle_runtime(rec, verify=True)
        return rec

    def _bundle_runtime(self, rec: dict, verify: bool) -> None:
        """Put the runtime at its path in the cache; the caller holds the index lock.

        gc deletes runtime directories only under the index lock too, so a
        runtime found here stays until this lock is released; publish calls
        this again (verify=False: presence only) in the same locked section
        that commits an entry using it.
        """
        sha = rec["sha256"]
        dest = self.root / rec["path"]
        if dest.is_file() and dest.stat().st_size == rec["size"] and (not verify or sha256_file(dest) == sha):
            return
        source = self._runtime_sources.get(sha)
        if source is None:
            raise CacheError(f"runtime {sha[:16]} vanished from the cache and its source is unknown; "
                             "run the build again", cache_dir=str(self.root))
        work = Path(tempfile.mkdtemp(prefix="runtime-", dir=self.tmp_dir()))
        try:
            shutil.copyfile(source, work / RUNTIME_LIB_NAME)
        except OSError:  # a full disk: leave no partial copy behind on it
            shutil.rmtree(work, ignore_errors=True)
            raise
        if sha256_file(work / RUNTIME_LIB_NAME) != sha:
            shutil.rmtree(work, ignore_errors=True)
            raise CacheError(f"{source} changed while it was copied into the cache; run the build again",
                             cache_dir=str(self.root))
        _publishable(work)
        if dest.parent.exists():
            self._discard(dest.parent)
        os.rename(work, dest.parent)

    def restore_runtimes(self, index: dict, only: set[str] | None = None) -> tuple[list[str], list[str]]:
        """Re-place bundled runtimes whose file is missing or altered: (restored, still bad).

        ``only``: just these runtime shas (a build restores those its cached
        entries use). The copy comes from a library with the same sha256: one
        this store already knows (a build's), or the installed CuTe DSL's,
        which is what a build machine has. Without one, the runtime stays bad;
        the loader then looks for a matching installed copy itself
        (run/load.py). Each is placed under the index lock, from the index as
        it is then: a runtime a concurrent ``gc`` unlisted since ``index`` was
        read is not re-created (nothing would list it, and gc keeps no
        unlisted runtime dir).
        """
        restored, bad = [], []
        for sha, rec in sorted(index["runtimes"].items()):
            if only is not None and sha not in only:
                continue
            if not rec.get("path") or self.runtime_file_ok(rec):
                continue
            for lib in [self._runtime_sources.get(sha), *_installed_runtimes()]:
                with contextlib.suppress(OSError, TypeError):
                    if lib and sha256_file(Path(lib)) == sha:
                        self._runtime_sources[sha] = lib
                        break
            else:
                bad.append(sha)
                continue
            with self._locked_index():
                now = self.load_index()[0]["runtimes"].get(sha)
                if not now or not now.get("path"):
                    continue  # unlisted (or made bare) meanwhile: nothing to restore
                self._bundle_runtime(now, verify=True)
            restored.append(sha)
        return restored, bad

    def runtime_file_ok(self, rec: dict) -> bool:
        """Whether a bundled runtime record's file is in place with its hash."""
        try:
            return sha256_file(resolve_inside(self.root, rec["path"])) == rec["sha256"]
        except (OSError, IntegrityError):
            return False

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
        trace("publish-rename", key=key)
        if target.exists():
            self._discard(target)
        os.rename(build_dir, target)

        slim = index_record(record)

        def add(index: dict) -> None:
            # A bundled record already listed stays, whatever this build's
            # record says: a --no-bundle-runtime build into a cache that
            # bundles its runtime must not unlist the file services load.
            # A concurrent gc may have removed the file: it is re-placed here.
            if not self._commit_runtime(index, runtime["sha256"], runtime) and runtime.get("path"):
                self._bundle_runtime(runtime, verify=False)  # raises, saying why it cannot be placed
            index["entries"][key] = slim

        trace("publish", key=key)
        self.update_index(add)
        return record

    # ------------------------------------------------ adopt (merge, pull)
    # Entries built elsewhere arrive complete: an artifact and the entry.json
    # bytes of the cache that built them. They go through the same commit as
    # publish(): a private dir under tmp/, the key's lock, a rename, and the
    # index last; but all of one merge or pull is committed by ONE index
    # write, so readers see none of it or all of it.

    def stage_entry(self, key: str, artifact: Path, entry_json: bytes, sha256: str, size: int) -> Path:
        """Copy an artifact and its record into a private dir under tmp/.

        The copy is hashed as it is written, so what gets published is exactly
        what was checked, even if the source changes meanwhile. Raises
        IntegrityError (and leaves nothing) when the bytes do not match.
        """
        import hashlib  # noqa: PLC0415 - only merge and pull stage entries

        work = Path(tempfile.mkdtemp(prefix=f"adopt-{key[:12]}-", dir=self.tmp_dir()))
        try:
            h, n = hashlib.sha256(), 0
            with open(artifact, "rb") as src, open(work / ARTIFACT_NAME, "wb") as dst:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    n += len(chunk)
                    dst.write(chunk)
            if h.hexdigest() != sha256 or n != size:
                raise IntegrityError(
                    f"{artifact}: {n} bytes with sha256 {h.hexdigest()[:16]}..., but its record "
                    f"says {size} bytes with sha256 {sha256[:16]}...; refusing it",
                    path=str(artifact), key=key)
            (work / ENTRY_RECORD).write_bytes(entry_json)
            _publishable(work)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return work

    def publish_file(self, rel: str, src: Path, sha256: str) -> None:
        """Place a verified file at ``rel`` (for index-listed extra files).

        Written to a temp file and renamed, so the path holds the old bytes or
        the new ones. The caller commits the index record afterwards.
        """
        dest = resolve_inside(self.root, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / TMP_DIR / f"file-{uuid.uuid4().hex}"
        shutil.copyfile(src, tmp)
        if sha256_file(tmp) != sha256:
            tmp.unlink(missing_ok=True)
            raise IntegrityError(f"{src} changed while it was copied; refusing it", path=str(src))
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)

    def adopt(self, staged: dict[str, tuple[Path, dict]], runtimes: dict[str, dict],
              mutate: Callable[[dict], None] | None = None) -> dict[str, list]:
        """Commit staged entries ``{key: (work_dir, slim index record)}``.

        Bundled runtimes named by ``runtimes`` must already be in place
        (ensure_runtime). Takes every key's lock, in sorted order (builds
        never wait while holding a lock, so this cannot deadlock), re-reads
        the index, renames the dirs of keys still missing, then writes the
        index once (``mutate`` may add more to that same write). A key that
        another writer published meanwhile is left alone: ``present`` if its
        bytes are the same, ``conflicts`` if not. Returns those lists and
        ``added``.

        Like publish(), the index write checks, under the index lock, that
        the bundled runtime of every entry it commits is in place: a
        concurrent ``gc`` may have removed it since the caller found it there.
        It is re-placed from a known copy (ensure_runtime's source, or one
        named by note_runtime_source); where none is known, the entries that
        need it are not committed (their dirs are discarded), the rest are,
        and CacheError says to run the merge or pull again.
        """
        out: dict[str, list] = {"added": [], "present": [], "conflicts": []}
        unplaced: dict[str, str] = {}  # key -> the runtime it needs that could not be placed
        locks = []
        try:
            for key in sorted(staged):
                lock = self.key_lock(key)
                try:
                    lock.acquire()
                except Timeout:
                    raise CacheError(
                        f"timed out after {lock.timeout:.0f}s waiting for {lock.lock_file}; "
                        "retry, or raise CUTLASS_AOT_LOCK_TIMEOUT", cache_dir=str(self.root)) from None
                except _LOCK_PATH_ERRORS as exc:
                    raise self._lock_error(lock, exc) from None
                locks.append(lock)
            index, _ = self.load_index()
            for key in sorted(staged):
                work, rec = staged[key]
                if self.entry_ok(index, key):
                    same = index["entries"][key]["sha256"] == rec["sha256"]
                    out["present" if same else "conflicts"].append(key)
                    shutil.rmtree(work, ignore_errors=True)
                    continue
                target = entry_dir(self.root, key)
                if target.exists():
                    self._discard(target)
                os.rename(work, target)
                out["added"].append(key)

            def add(idx: dict) -> None:
                unplaced.clear()  # decided on this index, under this lock
                placed: dict[str, bool] = {}
                for key in out["added"]:
                    sha = staged[key][1]["runtime"]
                    if sha not in placed:
                        placed[sha] = self._commit_runtime(idx, sha, runtimes.get(sha))
                    if not placed[sha]:
                        unplaced[key] = sha
                        continue
                    idx["entries"][key] = staged[key][1]
                if mutate is not None:
                    mutate(idx)

            if out["added"] or mutate is not None:
                self.update_index(add)
            for key in unplaced:  # never listed; we still hold its lock
                out["added"].remove(key)
                self._discard(entry_dir(self.root, key))
        finally:
            for lock in reversed(locks):
                lock.release()
            for work, _ in staged.values():
                if work.exists():
                    shutil.rmtree(work, ignore_errors=True)
        if unplaced:
            shas = sorted(set(unplaced.values()))
            raise CacheError(
                f"runtime {', '.join(s[:16] for s in shas)} was removed from {self.root} while "
                f"{len(unplaced)} entries that need it were being committed (a concurrent `gc` "
                "dropped the last entries using it), and no copy of it is known here; those entries "
                f"were not committed (e.g. {sorted(unplaced)[0][:16]}), the rest were: run the merge "
                "or pull again", cache_dir=str(self.root), keys=sorted(unplaced), runtimes=shas)
        return out

    def note_runtime_source(self, sha: str, path: str) -> None:
        """Remember a copy of runtime ``sha`` outside this cache (a merge source's),
        so that a commit can re-place it if a concurrent gc removed it here."""
        self._runtime_sources.setdefault(sha, path)

    def _commit_runtime(self, idx: dict, sha: str, incoming: dict | None) -> bool:
        """Record runtime ``sha`` in ``idx`` for entries about to be committed, and
        make sure a bundled one's file is in place; False if it cannot be.
        The caller holds the index lock (gc removes runtimes only under it)."""
        rec = idx["runtimes"].get(sha)
        if (rec is None or rec.get("path") is None) and incoming is not None:
            rec = incoming  # a bundled copy replaces a bare record
        if rec is None or rec.get("path") is None:
            if rec is not None:
                idx["runtimes"][sha] = rec
            return True
        try:
            self._bundle_runtime(rec, verify=False)
        except (CacheError, OSError):
            return False
        idx["runtimes"][sha] = rec
        return True

    def _discard(self, path: Path) -> None:
        """Rename ``path`` (a dir, a file or a link) out of the way, then delete it.

        Nothing is deleted in place: the rename is atomic, so a reader sees the
        old thing or nothing. A path that is not there, or whose parent is not
        a directory (``entries`` made a file), has nothing to discard.
        """
        trash = self.root / TMP_DIR / f"trash-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except (FileNotFoundError, NotADirectoryError):
            return
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                trash.unlink()

    # --------------------------------------------------------------- verify
    def verify(self, repair: bool = False) -> dict[str, Any]:
        """Re-hash every entry and runtime; optionally drop what is bad.

        Dropping goes through ``_remove_entries``: an entry is dropped only if
        the index still lists it, under its key lock, and it still fails then.
        """
        if repair:
            self.require_writable()
        problems: list[dict[str, str]] = []
        if repair and not index_path(self.root).exists() and any(
                (self.root / ENTRIES_DIR).glob("*/" + ENTRY_RECORD)):
            # The index was lost (or moved away, as read_index's advice says):
            # rebuild it from the entry records, keeping what verifies.
            index = self.update_index(lambda idx: None)
            problems.append({"what": "index", "problem": "missing; rebuilt from "
                             f"{len(index['entries'])} entry records"})
            return {"checked": len(index["entries"]), "tables": len(index.get("tables", {})),
                    "problems": problems, "repaired": True}
        try:
            index = read_index(self.root, missing_ok=True)
        except IntegrityError as exc:
            problems.append({"what": "index", "problem": exc.message})
            if repair:
                # update_index re-reads under the lock and rebuilds from the
                # entry records on disk *then*, not from a copy made earlier.
                index = self.update_index(lambda idx: None)
            else:
                index, _ = self.scan_entries()
            return {"checked": len(index["entries"]), "tables": len(index.get("tables", {})),
                    "problems": problems, "repaired": repair}
        # Readers take no lock, so a gc or a publish may change the index while
        # this runs: a problem is reported only if the index, read again after
        # the check, still lists the record that failed (gc unlists before it
        # deletes; a publish lists a new record only once its files are in place).
        # (One re-read for all of them: per failing record it made verify
        # quadratic on a damaged cache, 22 s for 888 missing entries.)
        failing = [(key, rec, why) for key, rec in sorted(index["entries"].items())
                   if (why := self._entry_problem(rec)) is not None]
        now = self._reread() if failing else None
        bad: list[str] = []
        for key, rec, why in failing:
            if self._still_listed(now, "entries", key, rec):
                problems.append({"what": key, "problem": why})
                bad.append(key)
        restored: list[str] = []
        if repair:
            restored, _ = self.restore_runtimes(index)
        broken = {sha for sha, rec in index["runtimes"].items()
                  if rec.get("path") is not None and sha not in restored and not self.runtime_file_ok(rec)}
        now = self._reread() if broken else None
        for sha, rec in sorted(index["runtimes"].items()):
            if rec.get("path") is None:
                continue
            if sha in restored:
                problems.append({"what": f"runtime {sha[:16]}", "problem": "missing or altered; "
                                 "restored from the installed nvidia-cutlass-dsl"})
            elif sha in broken and self._still_listed(now, "runtimes", sha, rec):
                problems.append({"what": f"runtime {sha[:16]}", "problem": (
                    "missing or altered" + (", and no installed nvidia-cutlass-dsl has it" if repair
                                            else "") +
                    ": `verify --repair` on a machine with the DSL that built it restores it; until "
                    "then the loader needs that DSL installed, or CUTLASS_AOT_RUNTIME_LIB")})
        for slot, rec in sorted(index.get("tables", {}).items()):
            _, why = self.read_table(rec)
            if why is not None:
                problems.append({"what": f"selection table {slot}", "problem": why})
        dropped: list[str] = []
        if repair and bad:
            dropped, _ = self._remove_entries(
                bad, lambda key, rec: rec is not None and self._entry_problem(rec) is not None)
        return {"checked": len(index["entries"]), "tables": len(index.get("tables", {})),
                "problems": problems, "repaired": repair and bool(dropped or restored)}

    def _reread(self) -> dict | None:
        """The index as it is on disk now (verify's re-read before it reports
        problems found without a lock), or None if it went bad meanwhile."""
        try:
            return read_index(self.root, missing_ok=True)
        except CacheError:
            return None

    @staticmethod
    def _still_listed(now: dict | None, section: str, name: str, rec: dict) -> bool:
        """Whether the re-read index ``now`` lists ``rec`` under ``section``/``name``
        (None: the index went bad meanwhile, so what was found is reported)."""
        return now is None or now[section].get(name) == rec

    def _entry_problem(self, rec: dict) -> str | None:
        """Why an indexed entry's artifact fails its record, or None."""
        try:
            lib = resolve_inside(self.root, rec["path"])
            actual = sha256_file(lib)
        except FileNotFoundError:
            return f"artifact {rec['path']} is missing"
        except (OSError, IntegrityError) as exc:
            return str(exc)
        if actual != rec["sha256"]:
            return (f"sha256 of {rec['path']} is {actual[:16]}..., "
                    f"index records {rec['sha256'][:16]}...")
        try:
            check_record(rec["key"], rec, (lib.parent / ENTRY_RECORD).read_bytes())
        except FileNotFoundError:
            return f"{ENTRY_RECORD} of {rec['path']} is missing"
        except (OSError, IntegrityError) as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------ gc
    def gc(self, keep: set[str] | None, older_than_s: float | None) -> dict[str, Any]:
        """Remove entries not in ``keep`` (if given) or older than the age.

        Also removes orphans (entry dirs and lock files of keys the index does
        not list, whose lock no one holds), runtimes no entry uses (and runtime/<sha>
        dirs no listed record names), and what
        killed writers left in tmp/.
        """
        self.require_writable()
        now = _dt.datetime.now(_dt.UTC)

        def stale(rec: dict) -> bool:
            if keep is not None and rec["key"] not in keep:
                return True
            if older_than_s is not None:
                try:
                    built = _dt.datetime.fromisoformat(rec["built_at"])
                except ValueError:
                    return True
                return (now - built).total_seconds() > older_than_s
            return False

        index, _ = self.load_index()
        candidates = {k for k, rec in index["entries"].items() if stale(rec)}
        entries = self.root / ENTRIES_DIR
        candidates |= {d.name for d in (entries.iterdir() if entries.is_dir() else ())
                       if is_sha256(d.name) and d.name not in index["entries"]}
        locks = self.root / LOCKS_DIR
        candidates |= {p.stem for p in (locks.glob("*.lock") if locks.is_dir() else ())
                       if is_sha256(p.stem) and p.stem not in index["entries"]}

        # Decided again under the key's lock and the index lock, on the index
        # as it is then: listed and stale, or not listed at all (an orphan).
        removed, freed = self._remove_entries(
            candidates, lambda key, rec: rec is None or stale(rec))
        freed += self._drop_unused_runtimes()
        freed += self.sweep_tmp(older_than_s=3600)
        kept = len(read_index(self.root, missing_ok=True)["entries"])
        return {"removed": len(removed), "bytes_freed": freed, "kept": kept}

    def _remove_entries(self, keys, decide: Callable[[str, dict | None], bool]) -> tuple[list[str], int]:
        """Delete entries, under the same locks as publishing.

        For each key: take its lock (skip it if a build holds it: that build
        is about to publish it), take the index lock, re-read the index, ask
        ``decide(key, record or None)``; if yes, write the index without it,
        release the index lock, then delete ``entries/<key>/`` and its lock
        file while still holding the key lock. Returns (keys removed, bytes).
        """
        removed: list[str] = []
        freed = 0
        ordered = sorted(keys)
        for start in range(0, len(ordered), _LOCK_BATCH):
            held: dict[str, FileLock] = {}
            try:
                for key in ordered[start:start + _LOCK_BATCH]:
                    lock = self.acquire_key(key, timeout=0)
                    if lock is not None:
                        held[key] = lock
                if not held:
                    continue
                with self._locked_index():
                    index, _ = self.load_index()
                    doomed = [k for k in held if decide(k, index["entries"].get(k))]
                    listed = [k for k in doomed if k in index["entries"]]
                    if listed:
                        for k in listed:
                            del index["entries"][k]
                        self._write_index(index)
                for key in doomed:  # the index no longer lists them; we hold their locks
                    d = entry_dir(self.root, key)
                    had_entry = key in listed or d.exists()
                    freed += _tree_bytes(d)
                    self._discard(d)
                    try:
                        os.unlink(self.root / LOCKS_DIR / f"{key}.lock")
                    except OSError:
                        pass
                    if had_entry:
                        removed.append(key)
            finally:
                for lock in held.values():
                    lock.release()
        return removed, freed

    def _drop_unused_runtimes(self) -> int:
        """Remove runtimes no listed entry uses, and runtime/<sha> dirs no listed
        record names, under the index lock.

        A build that has bundled a runtime but not yet published an entry
        using it re-creates it inside its own publish (see _bundle_runtime).
        """
        freed = 0
        with self._locked_index():
            index, _ = self.load_index()
            used = {rec["runtime"] for rec in index["entries"].values()}
            dead = [sha for sha in index["runtimes"] if sha not in used]
            if dead:
                for sha in dead:
                    del index["runtimes"][sha]
                self._write_index(index)
            # runtime/<sha> dirs no listed record names: what a gc racing a
            # publish or a restore left, or a bundle whose build never published.
            named = {sha for sha, rec in index["runtimes"].items() if rec.get("path")}
            base = self.root / RUNTIME_DIR
            unnamed = [d.name for d in (base.iterdir() if base.is_dir() and not base.is_symlink() else ())
                       if is_sha256(d.name) and d.name not in named]
            for sha in sorted({*dead, *unnamed}):
                d = base / sha
                freed += _tree_bytes(d)
                self._discard(d)
        return freed

    # ---------------------------------------------------- selection tables
    def read_table(self, rec: dict) -> tuple[dict | None, str | None]:
        """A listed selection table's document, checked against its index
        record (size, sha256, format, gpu), or None and what is wrong."""
        try:
            data = resolve_inside(self.root, rec["path"]).read_bytes()
        except (OSError, IntegrityError) as exc:
            return None, f"missing or unreadable ({exc})"
        if len(data) != rec["size"] or hashlib.sha256(data).hexdigest() != rec["sha256"]:
            return None, "bytes do not match the index record (size or sha256)"
        try:
            doc = parse_table_bytes(data, rec["path"])
        except IntegrityError as exc:
            return None, exc.message
        if doc["gpu"] != rec["gpu"]:
            return None, "the table's gpu differs from its index record"
        return doc, None

    def publish_table(self, doc: dict, merge: bool = False) -> dict[str, Any]:
        """Publish a selection table: ``tables/<sha256>.json``, then the index.

        One table per GPU kind (its slot); a new table for a slot replaces
        the old one in the same index commit, and the old file goes after.
        Readers of the old index that find its file gone fall back to the
        model, never to a wrong table. ``merge``: keep the old table's rows
        for problems the new one did not measure (read under the index lock,
        so a concurrent tune's rows are not lost).
        """
        validate_table(doc, "table to publish")
        with self._locked_index():
            index, _ = self.load_index()
            if merge:
                doc = dict(doc, rows=merge_rows(self._rows_of(index, doc["gpu"]), doc["rows"]))
            record, replaced = self._put_table(index, doc)
            self._write_index(index)
        self._delete_tables(replaced)
        return record

    def table_rows(self, gpu: dict) -> list[dict]:
        """Rows of the cache's table for a GPU ([] if none or unreadable)."""
        return self._rows_of(read_index(self.root, missing_ok=True), gpu)

    def table_doc(self, gpu: dict) -> dict | None:
        """The cache's whole table for a GPU (None if none or unreadable)."""
        return self._doc_of(read_index(self.root, missing_ok=True), gpu)

    def prune_tables(self) -> dict[str, int]:
        """Drop table rows whose variant the index no longer lists (gc), under the index lock."""
        dropped: dict[str, int] = {}
        replaced: list[str] = []
        with self._locked_index():
            index, _ = self.load_index()
            have = {(r.get("signature_text"), r["family"], schedule_of(r["variant"]))
                    for r in index["entries"].values()}
            for slot, rec in list(index.get("tables", {}).items()):
                rows = self._rows_of(index, rec["gpu"])
                keep = [r for r in rows
                        if (r["signature"], r["family"], schedule_of(r["variant"])) in have]
                if rows and len(keep) != len(rows):
                    dropped[slot] = len(rows) - len(keep)
                    doc = json.loads(resolve_inside(self.root, rec["path"]).read_bytes())
                    _, old = self._put_table(index, dict(doc, rows=keep))
                    replaced += old
            if dropped:
                self._write_index(index)
        self._delete_tables(replaced)
        return dropped

    def _rows_of(self, index: dict, gpu: dict) -> list[dict]:
        doc = self._doc_of(index, gpu)
        return doc["rows"] if doc is not None else []

    def _doc_of(self, index: dict, gpu: dict) -> dict | None:
        rec = index.get("tables", {}).get(table_slot(gpu))
        # A damaged table gives None: verify reports it; rows are not guessed from it.
        return self.read_table(rec)[0] if rec else None

    def _put_table(self, index: dict, doc: dict) -> tuple[dict, list[str]]:
        """Write a table file (content-addressed, atomic) and point its slot at it."""
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
        old = index.setdefault("tables", {}).get(slot)
        index["tables"][slot] = record
        return record, ([old["path"]] if old and old["path"] != rel else [])

    def _delete_tables(self, paths: list[str]) -> None:
        for rel in paths:
            with contextlib.suppress(OSError, IntegrityError):
                resolve_inside(self.root, rel).unlink()

def _publishable(path: Path) -> None:
    """Give a private build dir the modes of a published entry.

    mkdtemp makes 0700 dirs; a cache built as root (a container image) must
    be readable by the service user that loads it. Nothing is made writable
    for others: the loader refuses world-writable caches.
    """
    os.chmod(path, 0o755)
    for child in path.iterdir():
        os.chmod(child, 0o644 if child.is_file() else 0o755)


def _installed_runtimes() -> list[str]:
    """libcute_dsl_runtime.so of the installed CuTe DSL (as run/load.py finds them),
    without importing it."""
    import importlib.util  # noqa: PLC0415 - only when rebuilding an index

    try:
        spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    except (ImportError, ValueError):
        return []
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    return [str(p) for d in dirs for p in sorted(Path(d).glob(f"cu*/lib/{RUNTIME_LIB_NAME}"))]


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
