"""Real builds into real caches: publishing, re-use, verification, repair,
gc, orphans, and how a variant's compile failure is reported.

The session fixture ``built_cache`` compiled TINY_MANIFEST once; tests that
change a cache take ``cache_copy``. Builds that must compile again are kept
to a few variants (each costs seconds on this 2-core machine).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil

import pytest

from cutlass_aot.builder.driver import build
from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.plan import plan
from cutlass_aot.builder.store import CacheStore
from cutlass_aot.errors import CacheError
from cutlass_aot.keys import content_key
from cutlass_aot.layout import LAYOUT_VERSION, index_record, read_index
from cutlass_aot.run.load import Cache
from tests.families import TOY_FAILURE
from tests.support import (
    RESIDUAL_ONLY_MANIFEST,
    TINY_VARIANTS,
    artifact,
    edit_index,
    flip_byte,
    index_file,
    load_index_json,
    run_cli,
    run_cli_json,
    sha256,
    tree_bytes,
    tree_snapshot,
    truncate,
)

RECORD_FIELDS = {"key", "path", "symbol", "abi", "family", "signature", "signature_text", "variant",
                 "tvm_ffi", "sha256", "size", "runtime", "built_at", "build_seconds", "manifest"}


def build_tiny(cache, manifest, jobs=2):
    return build([load_manifest(manifest)], cache, jobs=jobs)


# ------------------------------------------------------------------ publish
def test_build_publishes_every_variant(built_cache):
    root = built_cache.path
    index = read_index(root, missing_ok=False)
    assert set(index["entries"]) == set(built_cache.keys)
    jobs = plan([load_manifest(built_cache.manifest)])
    assert {j.key for j in jobs} == set(built_cache.keys)
    by_key = {j.key: j for j in jobs}
    for key, rec in index["entries"].items():
        assert RECORD_FIELDS <= set(rec), RECORD_FIELDS - set(rec)
        lib = artifact(root, key)
        assert rec["path"] == f"entries/{key}/kernel.so"
        assert rec["sha256"] == sha256(lib)
        assert rec["size"] == lib.stat().st_size > 0
        assert lib.read_bytes()[:4] == b"\x7fELF"
        job = by_key[key]
        assert rec["signature"] == job.signature.as_dict()
        assert rec["signature_text"] == str(job.signature)
        assert rec["variant"] == job.variant.param_dict
        # The index record is slim; the entry's own record keeps every key input,
        # so the key is recomputable from what is on disk.
        full = json.loads((root / "entries" / key / "entry.json").read_text())
        assert full["key_inputs"] == job.key_inputs
        assert content_key(full["key_inputs"]) == key
        assert rec["tvm_ffi"] == job.key_inputs["toolchain"]["tvm_ffi"] and "key_inputs" not in rec
        assert rec["abi"] == "cutlass-aot-gemm-v1" and rec["symbol"] == "gemm"
        assert isinstance(rec["build_seconds"], float) and rec["build_seconds"] > 0
        built_at = dt.datetime.fromisoformat(rec["built_at"])
        assert built_at.tzinfo is not None
        assert abs((dt.datetime.now(dt.UTC) - built_at).total_seconds()) < 3600
        assert rec["manifest"].startswith(f"{built_cache.manifest}:")
        # entry.json beside the artifact is the full record; the index holds its
        # slim form, so the index can be rebuilt from entry.json alone
        assert index_record(full) == rec
        assert rec["runtime"] in index["runtimes"]
    (rt_sha, rt), = index["runtimes"].items()
    assert rt["path"] == f"runtime/{rt_sha}/libcute_dsl_runtime.so"
    assert sha256(root / rt["path"]) == rt_sha == rt["sha256"]
    assert list((root / "tmp").iterdir()) == []  # no build leftovers
    assert CacheStore(root).verify() == {"checked": 3, "tables": 0, "problems": [], "repaired": False}


def test_second_build_compiles_nothing(cache_copy, built_cache):
    before = tree_snapshot(cache_copy)
    generation = load_index_json(cache_copy)["generation"]
    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.built == [] and report.failed == [] and report.repaired == []
    assert sorted(report.cached) == sorted(built_cache.keys)
    assert report.total == TINY_VARIANTS
    assert load_index_json(cache_copy)["generation"] == generation
    after = tree_snapshot(cache_copy)
    assert {k: v for k, v in after.items() if not k.startswith("locks")} == {
        k: v for k, v in before.items() if not k.startswith("locks")}


# ------------------------------------------------------------- corruption
def test_corrupted_artifacts_detected_by_verify_and_rebuilt(cache_copy, built_cache):
    k_trunc, k_flip, k_ok = built_cache.keys
    truncate(artifact(cache_copy, k_trunc))
    flip_byte(artifact(cache_copy, k_flip))

    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert rc == 1
    assert set(out) == {"checked", "tables", "problems", "repaired", "ok", "cache_dir"}
    assert out["ok"] is False and out["checked"] == 3 and out["repaired"] is False
    assert out["cache_dir"] == str(cache_copy)
    assert sorted(p["what"] for p in out["problems"]) == sorted([k_trunc, k_flip])
    assert all("sha256" in p["problem"] for p in out["problems"])

    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.failed == []
    assert sorted(report.built) == sorted([k_trunc, k_flip])
    assert report.cached == [k_ok]
    assert sum("failed verification" in n for n in report.repaired) == 2
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert (rc, out["ok"], out["problems"]) == (0, True, [])
    assert list((cache_copy / "tmp").iterdir()) == []  # the bad dirs were discarded
    cache = Cache(cache_copy)
    for key in built_cache.keys:
        assert cache.function(key) is not None


def test_missing_artifact_is_a_verify_problem(cache_copy, built_cache):
    key = built_cache.keys[0]
    os.unlink(artifact(cache_copy, key))
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert rc == 1 and out["problems"] == [
        {"what": key, "problem": f"artifact entries/{key}/kernel.so is missing"}]


def test_verify_repair_drops_bad_entries(cache_copy, built_cache):
    key = built_cache.keys[1]
    flip_byte(artifact(cache_copy, key))
    rc, out, _ = run_cli_json("verify", "--repair", "--cache-dir", cache_copy)
    assert rc == 1 and out["repaired"] is True
    assert key not in load_index_json(cache_copy)["entries"]
    assert not (cache_copy / "entries" / key).exists()
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert (rc, out["checked"]) == (0, 2)


def test_deleted_index_is_rebuilt_from_entry_records(cache_copy, built_cache):
    index_file(cache_copy).unlink()
    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.failed == []
    assert set(load_index_json(cache_copy)["entries"]) == set(built_cache.keys)
    assert report.built == [], f"recompiled {len(report.built)} variants whose entries were intact"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "bad-record"])
def test_damaged_index_build_reuses_entry_records(cache_copy, built_cache, damage):
    _damage_index(cache_copy, damage)
    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.failed == [] and report.built == []
    assert sorted(report.cached) == sorted(built_cache.keys)
    assert any("rebuilt from 3 entry records" in n for n in report.repaired), report.repaired


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "bad-record"])
def test_damaged_index_is_rewritten_by_next_build(cache_copy, built_cache, damage):
    _damage_index(cache_copy, damage)
    build_tiny(cache_copy, built_cache.manifest)
    index = read_index(cache_copy, missing_ok=False)  # raises IntegrityError while still damaged
    assert set(index["entries"]) == set(built_cache.keys)
    assert set(Cache(cache_copy).entries) == set(built_cache.keys)


def test_verify_repair_rewrites_a_damaged_index(cache_copy, built_cache):
    _damage_index(cache_copy, "truncate")
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert rc == 1 and out["problems"][0]["what"] == "index"
    assert "not valid JSON" in out["problems"][0]["problem"]
    rc, out, _ = run_cli_json("verify", "--repair", "--cache-dir", cache_copy)
    assert rc == 1 and out["repaired"] is True
    assert set(read_index(cache_copy)["entries"]) == set(built_cache.keys)
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert (rc, out["ok"]) == (0, True)


def _damage_index(cache, damage: str) -> None:
    path = index_file(cache)
    if damage == "truncate":
        truncate(path, path.stat().st_size // 3)
    elif damage == "garbage":
        path.write_bytes(os.urandom(2048))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "bad-record":  # valid JSON, one record with a wrong type
        edit_index(cache, lambda d: next(iter(d["entries"].values())).update(size="big"))
    else:
        raise ValueError(damage)


# ------------------------------------------------------------------------ gc
def test_gc_with_manifest_removes_unreferenced_entries(cache_copy, built_cache, tmp_path):
    keep_manifest = tmp_path / "keep.yaml"
    keep_manifest.write_text(RESIDUAL_ONLY_MANIFEST)
    (keep_key,) = [j.key for j in plan([load_manifest(keep_manifest)])]
    assert keep_key in built_cache.keys
    doomed = [k for k in built_cache.keys if k != keep_key]
    expected_bytes = sum(tree_bytes(cache_copy / "entries" / k) for k in doomed)

    rc, out, _ = run_cli_json("gc", keep_manifest, "--cache-dir", cache_copy)
    assert rc == 0
    assert out == {"removed": 2, "bytes_freed": expected_bytes, "kept": 1, "ok": True,
                   "table_rows_dropped": {}}
    assert set(load_index_json(cache_copy)["entries"]) == {keep_key}
    assert sorted(p.name for p in (cache_copy / "entries").iterdir()) == [keep_key]
    assert len(list((cache_copy / "runtime").iterdir())) == 1  # still used
    assert set(Cache(cache_copy).entries) == {keep_key}
    rc, out, _ = run_cli_json("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert out["removed"] == 0 and out["bytes_freed"] == 0


def test_gc_older_than(cache_copy, built_cache):
    old = built_cache.keys[0]
    edit_index(cache_copy, lambda d: d["entries"][old].update(built_at="2000-01-01T00:00:00+00:00"))
    rc, out, _ = run_cli_json("gc", "--older-than", "30d", "--cache-dir", cache_copy)
    assert rc == 0 and out["removed"] == 1 and out["kept"] == 2
    assert out["bytes_freed"] > 0
    assert old not in load_index_json(cache_copy)["entries"]
    assert not (cache_copy / "entries" / old).exists()


def test_gc_of_everything_frees_the_runtime_too(cache_copy):
    total = tree_bytes(cache_copy / "entries") + tree_bytes(cache_copy / "runtime")
    store = CacheStore(cache_copy)
    result = store.gc(keep=set(), older_than_s=None)
    assert result == {"removed": 3, "bytes_freed": total, "kept": 0}
    index = load_index_json(cache_copy)
    assert index["entries"] == {} and index["runtimes"] == {}
    assert list((cache_copy / "runtime").iterdir()) == []


def test_gc_sweeps_stale_work_dirs_of_killed_builds(cache_copy, built_cache):
    stale = []
    for name, payload in [("build-0123456789ab-dead", "kernel.o"), ("runtime-dead", "libcute_dsl_runtime.so")]:
        d = cache_copy / "tmp" / name
        d.mkdir()
        (d / payload).write_bytes(b"\0" * 4096)
        day_old = os.stat(d).st_mtime - 2 * 86400
        os.utime(d / payload, (day_old, day_old))
        os.utime(d, (day_old, day_old))
        stale.append(d)
    rc, out, _ = run_cli_json("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0
    assert [d.name for d in stale if d.exists()] == [], "two-day-old work dirs survived gc"


def test_orphan_entry_dir_is_invisible_and_collected(cache_copy, built_cache):
    orphan = "f" * 64
    shutil.copytree(cache_copy / "entries" / built_cache.keys[0], cache_copy / "entries" / orphan)
    cache = Cache(cache_copy)
    assert orphan not in cache.entries and orphan not in cache.unusable
    assert set(cache.entries) == set(built_cache.keys)
    assert CacheStore(cache_copy).verify()["problems"] == []
    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.built == [] and orphan not in load_index_json(cache_copy)["entries"]
    rc, out, _ = run_cli_json("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0 and out["removed"] == 1 and out["kept"] == 3
    assert not (cache_copy / "entries" / orphan).exists()


# --------------------------------------------------------- compile failures
FAILING_MANIFEST = """\
arch: sm_90a
kernels:
  - name: toy
    family: tests.families:ToyFamily
    params:
      x: [1, 2]
  - name: residual
    family: sm90_gemm
    params:
      a: bf16
      with_c: true
      tile: 128x128
  - name: new
    family: sm90_gemm
    params:
      a: bf16
      tile: 64x128
"""


def test_compile_failure_is_reported_and_others_still_build(cache_copy, tmp_path):
    manifest = tmp_path / "failing.yaml"
    manifest.write_text(FAILING_MANIFEST)
    jobs = {j.describe(): j.key for j in plan([load_manifest(manifest)])}
    toy_keys = {k for d, k in jobs.items() if d.startswith("tests.families:ToyFamily")}
    (new_key,) = [k for d, k in jobs.items() if "tile=64x128" in d]

    rc, out, err = run_cli_json("build", manifest, "--cache-dir", cache_copy, "-j", "2")
    assert rc == 1, err
    assert (out["ok"], out["total"], out["built"], out["cached"], out["failed"]) == (False, 4, 1, 1, 2)
    assert {f["key"] for f in out["failures"]} == toy_keys
    for f in out["failures"]:
        assert f["variant"].startswith("tests.families:ToyFamily ")
        assert f["error"].startswith(f"RuntimeError: {TOY_FAILURE} (x=")
        assert "arch=sm_90a" in f["error"]
        assert "Traceback" in f["output"] and "tests/families.py" in f["output"]
        assert f["manifest"] == f"{manifest}:3"
    index = load_index_json(cache_copy)
    assert new_key in index["entries"] and not toy_keys & set(index["entries"])
    assert not any((cache_copy / "entries" / k).exists() for k in toy_keys)
    assert list((cache_copy / "tmp").iterdir()) == []

    # Text mode: the failure goes to stderr, with the variant and the message; exit 1.
    proc = run_cli("build", manifest, "--cache-dir", cache_copy, "-j", "1")
    assert proc.returncode == 1
    assert proc.stderr.count("FAILED tests.families:ToyFamily") == 2
    assert TOY_FAILURE in proc.stderr
    assert "4 variants: 0 built, 2 cached, 2 failed" in proc.stdout


def test_build_report_keeps_failure_output(cache_dir, tmp_path):
    manifest = tmp_path / "toy.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: tests.families:ToyFamily\n"
                        "    params: {x: 2, mode: slow}\n")
    report = build([load_manifest(manifest)], cache_dir, jobs=1)
    assert report.built == [] and len(report.failed) == 1
    (fail,) = report.failed
    # The root cause, with the family's file and line that raised it.
    assert fail["error"].startswith(f"RuntimeError: {TOY_FAILURE} (x=2, mode=slow, arch=sm_90a) (")
    assert "families.py:" in fail["error"] and fail["error"].endswith("in compile)")
    assert "Traceback" in fail["output"]
    assert report.as_dict()["failed"] == 1
    # The layout exists, nothing was published, no build dir was left behind.
    # Nothing was published, but the directory is a cache (an empty index),
    # so `ls`/`verify` treat it as one.
    assert sorted(p.name for p in cache_dir.iterdir()) == ["entries", "index.json", "locks", "runtime", "tmp"]
    assert json.loads((cache_dir / "index.json").read_text())["entries"] == {}
    assert list((cache_dir / "entries").iterdir()) == [] and list((cache_dir / "tmp").iterdir()) == []


def test_older_layout_is_refused_by_readers_and_migrated_by_the_next_build(cache_copy, built_cache):
    """An index of an older layout: services refuse it with a rebuild hint;
    `build` rewrites it from the entry records, compiling nothing."""
    path = cache_copy / "index.json"
    data = json.loads(path.read_text())
    data["layout"] = LAYOUT_VERSION - 1
    path.write_text(json.dumps(data))
    with pytest.raises(CacheError, match="layout"):
        Cache(cache_copy)
    report = build_tiny(cache_copy, built_cache.manifest)
    assert report.built == [] and len(report.cached) == len(built_cache.keys)
    assert any("migrated" in note for note in report.repaired), report.repaired
    assert json.loads(path.read_text())["layout"] == LAYOUT_VERSION
    assert set(Cache(cache_copy).entries) == set(built_cache.keys)
