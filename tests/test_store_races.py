"""Deleting while others write: gc and verify --repair against a publish that
lands in the middle of them.

Each test runs gc or verify in this process and, at a fixed point inside it
(the first time it deletes something, or before it drops bad entries), lets
another *process* publish an entry through the real CacheStore.publish under
the real key lock. Nothing is simulated: the hook only chooses the moment.
The deletion must not remove what that publish committed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from cutlass_aot.builder.store import CacheStore
from cutlass_aot.layout import read_index
from tests.support import REPO, artifact, flip_byte, subprocess_env

PUBLISH = """
import json, shutil, sys
from pathlib import Path
from cutlass_aot.builder.store import CacheStore
root, key, src, runtime = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
store = CacheStore(root)
lock = store.key_lock(key)
lock.acquire(timeout=30)      # the build holds its key from before it compiles
print("held", flush=True)
sys.stdin.readline()          # ...compiling...
work = root / "tmp" / ("republish-" + key[:12])
shutil.copytree(src, work)
store.publish(key, str(work), json.loads((src / "entry.json").read_text()), runtime)
lock.release()
"""


class _Publisher:
    """Another build process: holds the key's lock now, publishes when told."""

    def __init__(self, cache: Path, key: str, saved: Path, runtime: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISH, str(cache), key, str(saved), json.dumps(runtime)],
            cwd=REPO, env=subprocess_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held", self.proc.stderr.read()[-2000:]

    def __call__(self) -> None:
        out, err = self.proc.communicate("go\n", timeout=120)
        assert self.proc.returncode == 0, err[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _once(fn):
    fired = []

    def hook(*args, **kwargs):
        if not fired:
            fired.append(True)
            fn()
    return hook, fired


def test_gc_never_deletes_an_entry_published_while_it_runs(cache_copy, built_cache, tmp_path, monkeypatch):
    keep, stale, late = built_cache.keys
    # `late` is not in the cache yet: its build is still running elsewhere.
    saved = tmp_path / "saved"
    shutil.copytree(cache_copy / "entries" / late, saved)
    store = CacheStore(cache_copy)
    index = read_index(cache_copy)
    runtime = index["runtimes"][index["entries"][late]["runtime"]]
    store.update_index(lambda idx: idx["entries"].pop(late))
    shutil.rmtree(cache_copy / "entries" / late)

    # That build commits right after gc has started deleting.
    publisher = _Publisher(cache_copy, late, saved, runtime)
    hook, fired = _once(publisher)
    real_discard = CacheStore._discard

    def discard(self, path):
        hook()
        return real_discard(self, path)

    monkeypatch.setattr(CacheStore, "_discard", discard)
    try:
        store.gc(keep={keep, late}, older_than_s=None)
    finally:
        publisher.close()
    assert fired
    after = read_index(cache_copy)
    assert set(after["entries"]) == {keep, late}
    assert artifact(cache_copy, late).is_file(), "gc deleted an entry the index lists"
    assert store.verify()["problems"] == []


def test_verify_repair_never_drops_an_entry_rebuilt_while_it_runs(cache_copy, built_cache, tmp_path, monkeypatch):
    key = built_cache.keys[0]
    saved = tmp_path / "saved"
    shutil.copytree(cache_copy / "entries" / key, saved)  # a good build of the same key
    index = read_index(cache_copy)
    runtime = index["runtimes"][index["entries"][key]["runtime"]]
    flip_byte(artifact(cache_copy, key))  # verify will find it bad...
    # ...and a build republishes it, good, before verify drops what it found.
    publisher = _Publisher(cache_copy, key, saved, runtime)
    hook, fired = _once(publisher)
    for name in ("update_index", "_remove_entries"):  # whichever drops entries (old or new code)
        real = getattr(CacheStore, name, None)
        if real is None:
            continue

        def wrapped(self, *args, _real=real, **kwargs):
            hook()
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(CacheStore, name, wrapped)
    store = CacheStore(cache_copy)
    try:
        result = store.verify(repair=True)
    finally:
        publisher.close()
    assert fired
    assert [p["what"] for p in result["problems"]] == [key]  # it was bad when checked
    after = read_index(cache_copy)
    assert key in after["entries"], "verify --repair dropped the rebuilt entry"
    assert artifact(cache_copy, key).is_file()
    assert CacheStore(cache_copy).verify()["problems"] == []


def test_gc_removes_runtime_only_under_the_index_lock_and_publish_restores_it(cache_copy, built_cache, tmp_path):
    """A build that decided to reuse runtime/<sha> publishes after gc removed it."""
    store = CacheStore(cache_copy)
    index = read_index(cache_copy)
    key = built_cache.keys[0]
    saved = tmp_path / "saved"
    shutil.copytree(cache_copy / "entries" / key, saved)
    runtime = index["runtimes"][index["entries"][key]["runtime"]]
    store.gc(keep=set(), older_than_s=None)  # everything goes, the runtime too
    assert not (cache_copy / runtime["path"]).exists()
    # The build had recorded the runtime (ensure_runtime) before gc ran.
    builder = CacheStore(cache_copy)
    src = tmp_path / "runtime-source.so"
    shutil.copyfile(built_cache.path / runtime["path"], src)
    builder._runtime_sources[runtime["sha256"]] = str(src)
    work = cache_copy / "tmp" / "late-build"
    shutil.copytree(saved, work)
    lock = builder.key_lock(key)
    with lock:
        builder.publish(key, str(work), json.loads((saved / "entry.json").read_text()), runtime)
    assert (cache_copy / runtime["path"]).is_file()
    assert CacheStore(cache_copy).verify()["problems"] == []


def test_gc_removes_lock_files_of_removed_entries(cache_copy, built_cache):
    keep = built_cache.keys[0]
    locks = cache_copy / "locks"
    for key in built_cache.keys:
        (locks / f"{key}.lock").touch()
    orphan = "f" * 64
    (locks / f"{orphan}.lock").touch()  # a failed build's lock file
    CacheStore(cache_copy).gc(keep={keep}, older_than_s=None)
    left = sorted(p.name for p in locks.iterdir())
    assert f"{keep}.lock" in left and f"{orphan}.lock" not in left
    assert not any(f"{k}.lock" in left for k in built_cache.keys[1:])


def test_gc_skips_entries_a_build_holds(cache_copy, built_cache):
    """An unlisted dir whose key lock is held is a build about to commit."""
    key = built_cache.keys[0]
    store = CacheStore(cache_copy)
    store.update_index(lambda idx: idx["entries"].pop(key))  # rename done, index not yet
    code = ("import sys,time; from filelock import FileLock; l=FileLock(sys.argv[1]); l.acquire();"
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(cache_copy / "locks" / f"{key}.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        store.gc(keep=set(built_cache.keys), older_than_s=None)
        assert artifact(cache_copy, key).is_file()
    finally:
        holder.kill()
        holder.wait()


def test_verify_repair_racing_gc_reports_nothing_gc_removed_and_restores_no_runtime(cache_copy, monkeypatch):
    """A `gc --older-than 0s` lands after verify read the index, before it checks
    the first entry (the reviewer's reproduction). verify used to report every
    entry gc had just removed, and `--repair` re-created the runtime gc had
    removed, in a runtime/ dir no record listed and no gc ever reclaimed."""
    hook, fired = _once(lambda: CacheStore(cache_copy).gc(keep=None, older_than_s=0))
    real = CacheStore._entry_problem

    def entry_problem(self, rec):
        hook()
        return real(self, rec)

    monkeypatch.setattr(CacheStore, "_entry_problem", entry_problem)
    result = CacheStore(cache_copy).verify(repair=True)
    assert fired
    assert result["problems"] == [], result
    assert read_index(cache_copy)["entries"] == {} and read_index(cache_copy)["runtimes"] == {}
    assert list((cache_copy / "runtime").iterdir()) == []


def test_gc_removes_runtime_dirs_no_record_names(cache_copy, built_cache):
    """A runtime/<sha> dir the index does not list (what the race above used to
    leave) is reclaimed by the next gc; a listed one, and names that are not a
    sha256, stay."""
    (sha, rec), = read_index(cache_copy)["runtimes"].items()
    orphan = cache_copy / "runtime" / ("e" * 64)
    shutil.copytree(cache_copy / "runtime" / sha, orphan)
    (cache_copy / "runtime" / "operator-notes").mkdir()
    result = CacheStore(cache_copy).gc(keep=set(built_cache.keys), older_than_s=None)
    assert not orphan.exists() and result["bytes_freed"] > 0, result
    assert sorted(p.name for p in (cache_copy / "runtime").iterdir()) == sorted([sha, "operator-notes"])
    assert CacheStore(cache_copy).verify()["problems"] == []


def test_verify_re_reads_the_index_once_not_per_failing_entry(cache_copy, monkeypatch):
    """r50 diff review: the re-read before reporting ran per failing record, so
    verify went quadratic on a damaged cache (888 missing entries: 22.7 s, from
    0.5 s). It re-reads once for the entries and once for the runtimes."""
    from cutlass_aot.builder import store as store_mod  # noqa: PLC0415

    for d in (cache_copy / "entries").iterdir():
        shutil.rmtree(d)
    calls = []
    real = store_mod.read_index
    monkeypatch.setattr(store_mod, "read_index", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = CacheStore(cache_copy).verify(repair=False)
    assert len(result["problems"]) == len(real(cache_copy)["entries"]) >= 2
    assert len(calls) <= 3, len(calls)  # the first read, one re-read (none for sound runtimes)
