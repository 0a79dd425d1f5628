"""Store and build hardening: races, hostile cache trees and oversized inputs.

Each test reproduces one confirmed failure of the writers (merge racing gc,
a symlinked tmp/, an index rebuilt without its runtimes and tables, one open
lock per planned key, manifests and --shard values too large to expand, a
file where ``entries/`` should be, YAML tags in ``tune:``) on real caches
(copies of the session's ``built_cache``) and the real CLI.

``ManyToyFamily`` below is a test family (referenced from manifests as
``tests.test_store_hardening:ManyToyFamily``) whose compile fails at once, so
a plan of hundreds of keys runs the builder's real lock and failure paths in
seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cutlass_aot import tables
from cutlass_aot.builder.family import KernelFamily
from cutlass_aot.errors import CacheError, ManifestError, UsageError
from cutlass_aot.signature import Signature
from tests.support import (
    REPO,
    TINY_MANIFEST,
    cli_argv,
    copy_cache,
    edit_index,
    load_index_json,
    make_tree_writable,
    run_cli,
    run_cli_json,
    sha256,
    subprocess_env,
)

MANY = 300


class ManyToyFamily(KernelFamily):
    """MANY variants of one parameter; compiling any of them raises at once."""

    name = "manytoy"
    archs = ("sm_90a",)
    abi = "user:manytoy-v1"
    symbol = "manytoy"
    params = {"x": tuple(range(MANY))}
    defaults: dict = {}

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return Signature.make("manytoy", arch, {"x": variant["x"]})

    def source_files(self) -> list[Path]:
        return [Path(__file__)]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        raise RuntimeError(f"manytoy kernels never compile (x={variant['x']})")


@pytest.fixture
def copies(built_cache, tmp_path):
    """copies(name): a private copy of the session cache, removed afterwards."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(copy_cache(built_cache.path, tmp_path / name))
        return made[-1]

    yield make
    for path in made:
        make_tree_writable(path)
        shutil.rmtree(path, ignore_errors=True)


def _runtime(cache: Path) -> tuple[str, dict]:
    (sha, rec), = load_index_json(cache)["runtimes"].items()
    return sha, rec


# ------------------------------------------------------- 1. merge vs gc
def test_merge_replaces_a_runtime_that_a_concurrent_gc_removed(built_cache, copies, monkeypatch):
    """DST holds the runtime, so merge does not copy it; a gc then removes
    every entry using it (and so the runtime) before merge commits. The
    commit must put the runtime back (from the source's copy), never list a
    runtime whose file is gone."""
    from cutlass_aot.builder import merge as merge_mod  # noqa: PLC0415
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415

    src, dst = copies("src"), copies("dst")
    keys = sorted(built_cache.keys)
    CacheStore(dst).gc(keep=set(keys[:2]), older_than_s=None)  # DST lacks one entry, keeps the runtime
    sha, rec = _runtime(dst)
    assert rec["path"] and (dst / rec["path"]).is_file()

    adopt = CacheStore.adopt

    def gc_first(self, *args, **kwargs):  # the interleaving the race produces
        CacheStore(self.root).gc(keep=set(), older_than_s=None)
        assert not (dst / rec["path"]).exists() and sha not in load_index_json(dst)["runtimes"]
        return adopt(self, *args, **kwargs)

    monkeypatch.setattr(CacheStore, "adopt", gc_first)
    report = merge_mod.merge([src], dst)
    assert report.ok and report.added == [keys[2]], report.as_dict()
    assert (dst / rec["path"]).is_file()
    rc, data, err = run_cli_json("verify", "--cache-dir", dst)
    assert rc == 0 and not data["problems"], (data, err)


def test_adopt_without_a_copy_of_the_vanished_runtime_commits_none_of_its_entries(built_cache, copies):
    """Where no copy of the removed runtime is known (a pull that found it in
    place), the entries needing it are refused with a CacheError saying to run
    again: not listed, no directory left, and the index stays verifiable."""
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415

    src, dst = copies("src"), copies("dst")
    key = sorted(built_cache.keys)[0]
    store = CacheStore(dst)
    store.gc(keep=set(built_cache.keys) - {key}, older_than_s=None)
    sha, rec = _runtime(dst)
    slim = load_index_json(src)["entries"][key]
    work = store.stage_entry(key, src / slim["path"], (src / "entries" / key / "entry.json").read_bytes(),
                             slim["sha256"], slim["size"])
    store.gc(keep=set(), older_than_s=None)  # the runtime goes with the last entry using it
    with pytest.raises(CacheError, match="run the merge or pull again") as info:
        CacheStore(dst).adopt({key: (work, slim)}, {sha: rec})
    assert info.value.data["keys"] == [key]
    index = load_index_json(dst)
    assert key not in index["entries"] and sha not in index["runtimes"]
    assert not (dst / "entries" / key).exists()
    rc, data, err = run_cli_json("verify", "--cache-dir", dst)
    assert rc == 0 and not data["problems"], (data, err)


# ------------------------------------------------------- 2. tmp sweeping
def test_gc_never_sweeps_through_a_symlinked_tmp_nor_foreign_names(copies, tmp_path):
    cache = copies("c")
    old = time.time() - 3 * 86400
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "build-keep.txt").write_text("not the cache's")
    (outside / "notes").mkdir()
    for p in (outside / "build-keep.txt", outside / "notes"):
        os.utime(p, (old, old))
    shutil.rmtree(cache / "tmp", ignore_errors=True)
    (cache / "tmp").symlink_to(outside)
    res = run_cli("gc", "--older-than", "1000d", "--cache-dir", cache)
    assert res.returncode == 0, res.stderr
    assert (outside / "build-keep.txt").is_file() and (outside / "notes").is_dir()

    # A real tmp/: stale work dirs go, names no writer makes stay.
    (cache / "tmp").unlink()
    (cache / "tmp").mkdir()
    (cache / "tmp" / "build-0123456789ab-x").mkdir()
    (cache / "tmp" / "build-0123456789ab-x" / "kernel.o").write_bytes(b"o")
    (cache / "tmp" / "trash-file").write_bytes(b"t")
    (cache / "tmp" / "operator-notes.txt").write_text("mine")
    for p in (cache / "tmp").iterdir():
        os.utime(p, (old, old))
    res = run_cli("gc", "--older-than", "1000d", "--cache-dir", cache)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (cache / "tmp").iterdir()) == ["operator-notes.txt"]


# ------------------------------------------- 3. index rebuilt from records
def test_rebuilt_index_keeps_bare_runtimes_and_selection_tables(built_cache, copies, tmp_path):
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415

    cache = copies("c")
    sha, rec = _runtime(cache)
    # What --no-bundle-runtime leaves: a runtime record with path null, no file.
    edit_index(cache, lambda idx: idx["runtimes"][sha].update(path=None))
    shutil.rmtree(cache / "runtime" / sha)
    gpu = tables.gpu_identity("NVIDIA H200", 132, "9.0")
    other = tables.gpu_identity("NVIDIA A100", 108, "8.0")
    entry = load_index_json(cache)["entries"][built_cache.keys[0]]
    row = {"signature": entry["signature_text"], "family": "sm90_gemm", "kernel_sources": "x",
           "m": 128, "n": 256, "k": 512, "l": 1, "splits": 1, "us": 3.5,
           "variant": {"tile": "128x128", "cluster": "1x1", "raster": "m", "swizzle": 1,
                       "swap_ab": False, "split_k": False}}
    store = CacheStore(cache)
    doc = {"format": tables.TABLE_FORMAT, "version": 1, "gpu": gpu, "rows": [row]}
    store.publish_table(doc)
    store.publish_table(dict(doc, gpu=other))
    # A second, newer table for the H200 slot, written by hand: the newest wins.
    newer = tables.dumps_table(dict(doc, rows=[row, dict(row, m=256)]))
    newer_path = cache / "tables" / f"{hashlib.sha256(newer).hexdigest()}.json"
    newer_path.write_bytes(newer)
    os.utime(newer_path, (time.time() + 60, time.time() + 60))
    (cache / "tables" / ("0" * 64 + ".json")).write_text("{not a table")
    before = load_index_json(cache)

    (cache / "index.json").write_text("{garbage")
    index, notes = store.load_index()
    assert list(index["runtimes"]) == [sha] and index["runtimes"][sha]["path"] is None, index["runtimes"]
    assert set(index["tables"]) == set(before["tables"])
    assert index["tables"][tables_slot(other)]["path"] == before["tables"][tables_slot(other)]["path"]
    assert index["tables"][tables_slot(gpu)]["path"] == f"tables/{newer_path.name}"
    assert any("claim GPU" in n for n in notes) and any("0000000000000000" in n for n in notes), notes

    rc, data, err = run_cli_json("verify", "--repair", "--cache-dir", cache)
    assert rc != 0 and data["repaired"], (data, err)  # the unreadable index was the problem
    rc, data, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 0 and not data["problems"] and data["tables"] == 2, (data, err)
    # merge reads the rebuilt index: every entry names a listed runtime.
    rc, data, err = run_cli_json("merge", cache, "--cache-dir", tmp_path / "merged")
    assert rc == 0 and not data["corrupt"] and data["added"] == len(built_cache.keys), (data, err)


def tables_slot(gpu: dict) -> str:
    from cutlass_aot.layout import table_slot  # noqa: PLC0415

    return table_slot(gpu)


# ------------------------------------------------------- 4. lazy key locks
def test_build_of_many_keys_fits_a_small_open_file_limit(tmp_path):
    """One open lock per planned key exhausted `ulimit -n`; locks are taken as
    compile slots free up, so 300 keys build (here: fail, fast) under 96 fds."""
    manifest = tmp_path / "many.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: tests.test_store_hardening:ManyToyFamily\n"
                        f"    params:\n      x: [{', '.join(map(str, range(MANY)))}]\n")

    def small_fd_limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, hard))

    proc = subprocess.run(cli_argv("build", manifest, "--cache-dir", tmp_path / "c", "-j", "2", "--json"),
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300,
                          preexec_fn=small_fd_limit)
    assert "Traceback" not in proc.stderr and "Too many open files" not in proc.stderr, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["failed"] == MANY, data
    assert all("manytoy kernels never compile" in f["error"] for f in data["failures"])


# ------------------------------------------------ 5. variant limit, early
def _lists_manifest(path: Path, acts: str) -> Path:
    path.write_text(f"""\
arch: sm_90a
kernels:
  - family: sm90_gemm
    skip_unsupported: true
    params:
      a: [f16, bf16]
      b: [null, f16, bf16]
      d: [null, f16, bf16, f32]
      with_c: [false, true]
      a_major: [k, m]
      b_major: [k, n]
      d_major: [n, m]
      rank: [2, 3]
      tile: [128x128, 128x256, 256x128, 64x128]
      cluster: [1x1, 2x1]
      raster: [m, n]
      swizzle: [1, 2, 4, 8]
      swap_ab: [false, true]
      split_k: [false, true]
      pingpong: [false, true]
      act: {acts}
""")
    return path


def test_variant_limit_stops_expansion_before_the_plan_is_made(tmp_path):
    from cutlass_aot.builder.manifest import load_manifests  # noqa: PLC0415

    big = _lists_manifest(tmp_path / "big.yaml", "none")  # 393,216 combinations
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="more than the limit of 1000 variants") as info:
        load_manifests([big], max_variants=1000)
    assert time.monotonic() - t0 < 10 and info.value.data["limit"] == 1000
    assert "multiply to 393216 variants" in info.value.message  # counted, not made

    # Past any feasible build even with --yes: refused before expanding.
    huge = _lists_manifest(tmp_path / "huge.yaml", "[none, relu, gelu]")  # 1,179,648
    res = run_cli("build", huge, "--yes", "--cache-dir", tmp_path / "c", timeout=120)
    assert res.returncode == 2 and "combinations" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------- 6. shards
def test_shard_counts_past_the_plan_are_usage_errors(built_cache, copies, tiny_manifest):
    """N slices are made (and reported) in memory: N past the planned keys is
    refused before anything is allocated or the cache is touched."""
    cache = copies("c")
    before = load_index_json(cache)
    for text in ("1/99999999999999999999999", "1/1000000", f"1/{len(built_cache.keys) + 1}"):
        res = run_cli("build", tiny_manifest, "--cache-dir", cache, "--shard", text, timeout=120)
        assert res.returncode == 2 and "--shard" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert len(res.stdout) < 2000
    assert load_index_json(cache) == before
    res = run_cli("build", tiny_manifest, "--cache-dir", cache, "--shard", f"1/{len(built_cache.keys)}")
    assert res.returncode == 0, res.stderr


# ------------------------------------------- 7. repair of a hostile tree
def test_repair_with_files_where_entry_dirs_belong(built_cache, copies):
    cache = copies("c")
    shutil.rmtree(cache / "entries")
    (cache / "entries").write_text("not a directory")
    res = run_cli("verify", "--repair", "--cache-dir", cache)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert load_index_json(cache)["entries"] == {}

    cache = copies("c2")
    key = built_cache.keys[0]
    shutil.rmtree(cache / "entries" / key)
    (cache / "entries" / key).write_text("not a directory")
    res = run_cli("verify", "--repair", "--cache-dir", cache)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    index = load_index_json(cache)
    assert key not in index["entries"] and len(index["entries"]) == len(built_cache.keys) - 1
    assert not (cache / "entries" / key).exists()
    assert not [p.name for p in (cache / "tmp").iterdir() if p.name.startswith("trash-")]


# ------------------------------------------------- 8. tags in tune:
@pytest.mark.parametrize("tune", ["!!python/object:os.system {}", "[{? [1, 2] : 3}]"])
def test_yaml_tags_and_unhashable_keys_in_tune_are_manifest_errors(tmp_path, tune):
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415

    path = tmp_path / "m.yaml"
    path.write_text(TINY_MANIFEST + f"tune: {tune}\n")
    with pytest.raises(ManifestError, match="tune"):
        load_manifest(path)
    res = run_cli("build", path, "--cache-dir", tmp_path / "c", timeout=120)
    assert res.returncode == 2 and "tune" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("layout", [True, "1", 1.0])
def test_a_layout_that_is_not_a_number_is_repaired_as_corrupt_not_migrated(built_cache, copies, layout):
    """``layout: true`` once passed the writer's "older layout" test (True < 2) and
    was reported as a migration; it is a corrupt field of our own index: readers
    name it and point at `verify --repair`, and a writer rebuilds from the entries."""
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415 - build side
    from cutlass_aot.errors import IntegrityError  # noqa: PLC0415

    cache = copies("layout")
    edit_index(cache, lambda d: d.update(layout=layout))
    res = run_cli("info", "--cache-dir", cache)
    assert res.returncode == 1 and "verify --repair" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(IntegrityError, match="'layout' is"):
        from cutlass_aot.layout import read_index  # noqa: PLC0415

        read_index(cache)
    index, notes = CacheStore(cache).load_index()
    assert "unreadable" in notes[0] and "migrated" not in notes[0], notes
    assert sorted(index["entries"]) == sorted(built_cache.keys)


# ------------------------------------------- 9. r49 review: records, runtimes, modes, disks
def _retarget(rec: dict) -> None:
    """An index record edited to claim f32 output; entry.json still says f16."""
    fields = rec["signature"]["fields"]
    fields["d"] = "f32" if fields["d"] != "f32" else "f16"
    rec["signature_text"] = Signature.from_dict(rec["signature"]).text()


def test_an_index_record_that_contradicts_its_entry_json_is_neither_cached_nor_verified(built_cache, copies):
    """The loader trusts the index; only entry.json is bound to the key. An index
    record edited to another signature (self-consistent, so the loader would
    serve it to calls the artifact cannot handle) must fail verify, be dropped
    by verify --repair, and never count as cached for build."""
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415
    from cutlass_aot.run.load import Cache  # noqa: PLC0415

    cache = copies("contradict")
    key = sorted(built_cache.keys)[0]
    edit_index(cache, lambda d: _retarget(d["entries"][key]))
    store = CacheStore(cache)
    index, _ = store.load_index()
    assert not store.entry_ok(index, key)
    assert all(store.entry_ok(index, k) for k in built_cache.keys if k != key)
    rc, data, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 1 and [p["what"] for p in data["problems"]] == [key], (data, err)
    assert "disagrees with the index on ['signature', 'signature_text']" in data["problems"][0]["problem"]
    rc, data, err = run_cli_json("verify", "--repair", "--cache-dir", cache)
    assert rc == 1 and data["repaired"], (data, err)
    assert key not in Cache(cache).entries and len(Cache(cache).entries) == len(built_cache.keys) - 1
    rc, data, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 0 and not data["problems"], (data, err)


def test_a_signature_text_that_is_not_a_string_is_a_corrupt_record_for_every_reader(built_cache, copies):
    """`ls` sorted by it and crashed on null; readers now refuse the record and
    name `verify --repair`, which rebuilds the index from the entry records."""
    cache = copies("nulltext")
    key = sorted(built_cache.keys)[0]
    edit_index(cache, lambda d: d["entries"][key].update(signature_text=None))
    for verb in ("ls", "info"):
        res = run_cli(verb, "--cache-dir", cache)
        assert res.returncode == 1 and "signature_text is not a string" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    res = run_cli("verify", "--repair", "--cache-dir", cache)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert load_index_json(cache)["entries"][key]["signature_text"]
    assert run_cli("ls", "--cache-dir", cache).returncode == 0


def test_merge_skips_entries_whose_runtime_is_damaged_and_uses_the_destinations_good_copy(built_cache, copies):
    """A source whose bundled runtime fails its hash crashed merge with a
    KeyError, even when the destination held a good copy. Its entries now
    commit against the destination's copy where there is one, and are
    refused (reported, not copied) where there is none."""
    src, dst = copies("src"), copies("dst")
    sha, rec = _runtime(src)
    (src / rec["path"]).write_bytes(b"junk\n")
    key = sorted(built_cache.keys)[0]
    edit_index(dst, lambda d: d["entries"].pop(key))
    shutil.rmtree(dst / "entries" / key)
    rc, data, err = run_cli_json("merge", str(src), "--cache-dir", dst)
    assert "Traceback" not in err and data["added"] == 1, (data, err)
    assert key in load_index_json(dst)["entries"]
    assert rc == 1 and any(c["key"] == f"runtime {sha[:16]}" for c in data["corrupt"]), data
    rc, data, err = run_cli_json("verify", "--cache-dir", dst)
    assert rc == 0 and not data["problems"], (data, err)
    # No good copy anywhere: nothing that needs it is committed.
    fresh = src.parent / "fresh"
    rc, data, err = run_cli_json("merge", str(src), "--cache-dir", fresh)
    assert rc == 1 and "Traceback" not in err and data["added"] == 0, (data, err)
    assert sorted(c["key"] for c in data["corrupt"] if "is damaged in every source" in c["problem"]) == \
        sorted(built_cache.keys)
    assert load_index_json(fresh)["entries"] == {}


def test_verify_repair_restores_a_damaged_bundled_runtime_from_the_installed_dsl(built_cache, copies):
    """Nothing could repair a damaged bundled runtime: verify --repair dropped
    nothing, build found every entry cached. On a machine with the DSL that
    built it, verify --repair now copies it back."""
    cache = copies("rt")
    sha, rec = _runtime(cache)
    (cache / rec["path"]).write_bytes(b"junk\n")
    rc, data, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 1 and "no installed nvidia-cutlass-dsl has it" not in err, (data, err)
    assert [p["what"] for p in data["problems"]] == [f"runtime {sha[:16]}"]
    rc, data, err = run_cli_json("verify", "--repair", "--cache-dir", cache)
    assert rc == 1 and data["repaired"] and "restored" in data["problems"][0]["problem"], (data, err)
    assert sha256(cache / rec["path"]) == sha
    rc, data, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 0 and not data["problems"], (data, err)


def test_verify_repair_rebuilds_an_index_that_was_moved_away(built_cache, copies):
    """read_index's advice for an unreadable index is "move it away and run
    verify --repair", which refused a directory without an index."""
    cache = copies("moved")
    (cache / "index.json").rename(cache / "index.bak")
    assert run_cli("verify", "--cache-dir", cache).returncode == 2  # read-only: still refuses
    rc, data, err = run_cli_json("verify", "--repair", "--cache-dir", cache)
    assert rc == 1 and data["repaired"] and "rebuilt from 3 entry records" in data["problems"][0]["problem"], err
    assert sorted(load_index_json(cache)["entries"]) == sorted(built_cache.keys)
    assert run_cli("verify", "--cache-dir", cache).returncode == 0


def test_a_cache_made_under_a_strict_umask_is_readable_by_other_users(tmp_path):
    """index.json was written with the process umask (0600 under 077), and
    rewritten so on every write: a root-built image's service user could not
    read it. What the store creates is 0755 / 0644 whatever the umask."""
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415

    root = tmp_path / "strict" / "cache"
    old = os.umask(0o077)
    try:
        store = CacheStore(root)
        store.ensure()
        store.init_index()
        store.update_index(lambda idx: None)
    finally:
        os.umask(old)
    for path in (root, *(root / d for d in ("entries", "locks", "tmp", "runtime"))):
        assert path.stat().st_mode & 0o777 == 0o755, path
    assert (root / "index.json").stat().st_mode & 0o777 == 0o644


def test_a_full_disk_under_any_command_is_a_clear_error_not_a_traceback():
    """The command group turns a writer's ENOSPC (here the kernel's own, from
    /dev/full) into a CacheError: exit 2, what happened and what to do, in text or
    JSON."""
    import click  # noqa: PLC0415
    from click.testing import CliRunner  # noqa: PLC0415

    from cutlass_aot import cli  # noqa: PLC0415

    @click.group(cls=cli._Main)
    def group() -> None:
        pass

    @group.command()
    @cli.json_option
    def write(as_json: bool) -> None:
        with open("/dev/full", "wb") as f:
            f.write(b"x")
            f.flush()

    res = CliRunner().invoke(group, ["write"])
    assert res.exit_code == 2 and "the disk is full" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(group, ["write", "--json"])
    data = json.loads(res.output)
    assert res.exit_code == 2 and data["error"] == "CacheError" and "disk is full" in data["message"]


def test_an_index_lock_that_is_a_directory_is_named(built_cache, copies):
    cache = copies("lockdir")
    lock = cache / "locks" / "index.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    res = run_cli("gc", "--older-than", "3650d", "--cache-dir", cache)
    assert res.returncode == 2 and "is a directory" in res.stderr and "Traceback" not in res.stderr, res.stderr


# ------------------------------------------- 9. tmp/ on another filesystem
def _other_filesystem_dir(tmp_path: Path) -> Path:
    """A fresh dir under /dev/shm when that is another filesystem than tmp_path (else skip)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a writable /dev/shm on another filesystem than the test's tmp dir")
    import tempfile  # noqa: PLC0415

    return Path(tempfile.mkdtemp(prefix="cutlass-aot-test-", dir=shm))


def test_a_tmp_symlinked_to_another_filesystem_is_refused_before_compiling(cache_dir, tmp_path):
    """Builds work in tmp/ and publish by rename: a tmp/ that is a link to
    another filesystem used to crash the publish with an EXDEV traceback,
    leaving the compiled work dir behind. It is refused up front, naming tmp/."""
    from tests.support import RESIDUAL_ONLY_MANIFEST  # noqa: PLC0415

    elsewhere = _other_filesystem_dir(tmp_path)
    try:
        cache_dir.mkdir()
        (cache_dir / "tmp").symlink_to(elsewhere)
        manifest = tmp_path / "residual.yaml"
        manifest.write_text(RESIDUAL_ONLY_MANIFEST)
        res = run_cli("build", manifest, "--cache-dir", cache_dir, "-j", "1")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert f"{cache_dir / 'tmp'} is a symlink" in res.stderr, res.stderr
        assert list(elsewhere.iterdir()) == []  # no work dir was made there
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_a_rename_across_filesystems_under_any_command_is_a_clear_error(tmp_path):
    """The command group turns EXDEV (a real rename from /dev/shm) into a
    CacheError, exit 2, saying the cache must be on one filesystem."""
    import click  # noqa: PLC0415
    from click.testing import CliRunner  # noqa: PLC0415

    from cutlass_aot import cli  # noqa: PLC0415

    elsewhere = _other_filesystem_dir(tmp_path)
    try:
        (elsewhere / "work").mkdir()

        @click.group(cls=cli._Main)
        def group() -> None:
            pass

        @group.command()
        @cli.json_option
        def move(as_json: bool) -> None:
            os.rename(elsewhere / "work", tmp_path / "work")

        res = CliRunner().invoke(group, ["move"])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert "different filesystems" in res.output and str(elsewhere / "work") in res.output, res.output
        res = CliRunner().invoke(group, ["move", "--json"])
        data = json.loads(res.output)
        assert res.exit_code == 2 and data["error"] == "CacheError", data
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


# ------------------------------------------- 10. odd things where locks go
def test_a_key_lock_that_is_a_directory_is_named(built_cache, copies):
    cache = copies("keylockdir")
    key = built_cache.keys[0]
    lock = cache / "locks" / f"{key}.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    res = run_cli("gc", "--older-than", "0s", "--cache-dir", cache)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"{lock} is a directory" in res.stderr, res.stderr


def test_a_locks_dir_that_is_a_file_is_refused_by_every_writer(built_cache, copies, tiny_manifest):
    cache = copies("locksfile")
    shutil.rmtree(cache / "locks")
    (cache / "locks").write_text("not a directory")
    for args in (("gc", "--older-than", "0s"), ("verify", "--repair"), ("build", tiny_manifest)):
        res = run_cli(*args, "--cache-dir", cache)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr[-2000:])
        assert f"{cache / 'locks'} is not a directory" in res.stderr, (args, res.stderr)
    assert load_index_json(cache)["entries"].keys() == set(built_cache.keys)
