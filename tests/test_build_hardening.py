"""Builds that must not go wrong quietly: settings that change the bytes get a
new key, the runtime recorded is the one linked, a compiler process that
dies takes down only its own variant, and failures say why in plain text.

Real compiles (each costs seconds here), real worker processes, real signals.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from cutlass_aot.builder.driver import _Run, build
from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.store import CacheStore
from cutlass_aot.errors import CacheError
from cutlass_aot.layout import read_index
from tests.families import KillerGemmFamily
from tests.support import (
    REPO,
    RESIDUAL_ONLY_MANIFEST,
    run_cli,
    run_cli_json,
    sha256,
    subprocess_env,
)


def _runtime_lib() -> str:
    import importlib.util  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    for base in spec.submodule_search_locations:
        for lib in sorted(Path(base).glob("cu*/lib/libcute_dsl_runtime.so")):
            return str(lib)
    raise AssertionError("no libcute_dsl_runtime.so installed")


def test_rebuild_with_a_dsl_setting_compiles_again(cache_copy, tmp_path):
    """The issue's reproduction: CUTE_DSL_LINEINFO=1 used to report every entry cached."""
    manifest = tmp_path / "residual.yaml"
    manifest.write_text(RESIDUAL_ONLY_MANIFEST)
    rc, out, err = run_cli_json("build", manifest, "--cache-dir", cache_copy, "-j", "1")
    assert rc == 0 and out["cached"] == 1 and out["built"] == 0, out
    env = subprocess_env(CUTE_DSL_LINEINFO="1")
    rc, out, err = run_cli_json("build", manifest, "--cache-dir", cache_copy, "-j", "1", env=env)
    assert rc == 0, err[-2000:]
    assert out["built"] == 1 and out["cached"] == 0, out
    index = read_index(cache_copy)
    assert len(index["entries"]) == 4  # the old entry stays; the new one has its own key


def test_index_records_the_runtime_the_worker_linked(cache_dir, tmp_path):
    """CUTE_DSL_LIBS picks another libcute_dsl_runtime.so: the index must name it."""
    other = tmp_path / "libs" / "libcute_dsl_runtime.so"
    other.parent.mkdir()
    shutil.copyfile(_runtime_lib(), other)
    with open(other, "ab") as f:  # different bytes, same library (trailing data)
        f.write(b"\0cutlass-aot test: a runtime other than the installed one\0")
    manifest = tmp_path / "residual.yaml"
    manifest.write_text(RESIDUAL_ONLY_MANIFEST)
    env = subprocess_env(CUTE_DSL_LIBS=str(other))
    rc, out, err = run_cli_json("build", manifest, "--cache-dir", cache_dir, "-j", "1", env=env)
    assert rc == 0 and out["built"] == 1, (out, err[-2000:])
    index = read_index(cache_dir)
    (rec,) = index["entries"].values()
    assert rec["runtime"] == sha256(other) != sha256(_runtime_lib())
    bundled = cache_dir / index["runtimes"][rec["runtime"]]["path"]
    assert sha256(bundled) == sha256(other)
    # The artifact really was linked against it: its DT_NEEDED names the runtime.
    dyn = subprocess.run(["readelf", "-d", str(cache_dir / rec["path"])], capture_output=True, text=True)
    assert "libcute_dsl_runtime.so" in dyn.stdout


KILLER_MANIFEST = """\
arch: sm_90a
kernels:
  - family: tests.families:KillerGemmFamily
    params:
      a: bf16
      tile: [128x128, {guilty}, 128x64]
"""


def test_a_worker_that_kills_itself_fails_only_its_own_variant(cache_dir, tmp_path):
    manifest = tmp_path / "killer.yaml"
    manifest.write_text(KILLER_MANIFEST.format(guilty=KillerGemmFamily.GUILTY_TILE))
    report = build([load_manifest(manifest)], cache_dir, jobs=2)
    assert len(report.built) == 2, report.as_dict()
    (fail,) = report.failed
    assert f"tile={KillerGemmFamily.GUILTY_TILE}" in fail["variant"]
    assert "SIGKILL" in fail["error"], fail
    index = read_index(cache_dir)
    assert set(index["entries"]) == set(report.built)
    assert CacheStore(cache_dir).verify()["problems"] == []
    # Every key lock was released: another process takes each at once.
    code = ("import sys; from filelock import FileLock\n"
            "for p in sys.argv[1:]:\n    FileLock(p, timeout=0).acquire()\n")
    locks = [str(p) for p in (cache_dir / "locks").glob("*.lock")]
    proc = subprocess.run([sys.executable, "-c", code, *locks], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-1000:]


def test_cli_reports_the_killed_variant_and_exits_1(cache_dir, tmp_path):
    manifest = tmp_path / "killer.yaml"
    manifest.write_text(KILLER_MANIFEST.format(guilty=KillerGemmFamily.GUILTY_TILE)
                        .replace("[128x128, 64x128, 128x64]", "[64x128]"))
    proc = run_cli("build", manifest, "--cache-dir", cache_dir, "-j", "1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "BrokenProcessPool" not in proc.stderr
    assert "killed by SIGKILL" in proc.stderr


def test_text_mode_failure_names_the_root_cause_and_output_has_no_colour(cache_dir, tmp_path):
    manifest = tmp_path / "broken.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: tests.families:BrokenJitFamily\n"
                        "    params: {x: 1}\n")
    proc = run_cli("build", manifest, "--cache-dir", cache_dir, "-j", "1")
    assert proc.returncode == 1
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith("FAILED")]
    assert failed, proc.stderr
    assert "NameError" in failed[0] and "undefined_name_in_kernel" in failed[0]
    assert "families.py:" in failed[0]
    assert "\x1b[" not in proc.stdout + proc.stderr
    rc, out, _ = run_cli_json("build", manifest, "--cache-dir", cache_dir, "-j", "1")
    (fail,) = out["failures"]
    assert "undefined_name_in_kernel" in fail["output"] and "\x1b[" not in fail["output"]


def test_claim_releases_the_key_lock_when_the_index_read_raises(built_cache, cache_copy):
    """A lock taken before an index read that raises is released."""
    from cutlass_aot.builder.plan import plan  # noqa: PLC0415

    (job, *_) = plan([load_manifest(built_cache.manifest)])
    store = CacheStore(cache_copy)
    # An index of a newer layout: not ours to rewrite, so load_index raises.
    data = json.loads((cache_copy / "index.json").read_text())
    data["layout"] = 99
    (cache_copy / "index.json").write_text(json.dumps(data))
    run = _Run(store, report=None, notify=lambda *a: None, jobs=1, bundle_runtime=True)
    try:
        run._claim(job, timeout=0)
    except CacheError:
        pass
    else:
        raise AssertionError("load_index of a newer layout must raise")
    assert run.held == {}
    code = "import sys; from filelock import FileLock; FileLock(sys.argv[1], timeout=0).acquire()"
    proc = subprocess.run([sys.executable, "-c", code, str(cache_copy / "locks" / f"{job.key}.lock")],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-500:]


def test_keys_another_build_held_are_compiled_in_parallel(cache_dir, tmp_path, monkeypatch):
    """Keys deferred behind another builder's locks are compiled together, not one by one."""
    from cutlass_aot.builder.plan import plan  # noqa: PLC0415
    from tests.families import SlowFailingFamily  # noqa: PLC0415

    manifest = tmp_path / "slow.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: tests.families:SlowFailingFamily\n"
                        "    params: {x: [1, 2]}\n")
    loaded = [load_manifest(manifest)]
    keys = [j.key for j in plan(loaded)]
    (cache_dir / "locks").mkdir(parents=True)
    code = ("import sys, time; from filelock import FileLock\n"
            "locks = [FileLock(p) for p in sys.argv[1:]]\n"
            "[l.acquire() for l in locks]\nprint('held', flush=True)\ntime.sleep(4)\n")
    holder = subprocess.Popen([sys.executable, "-c", code,
                               *[str(cache_dir / "locks" / f"{k}.lock") for k in keys]],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        trace = tmp_path / "trace"
        monkeypatch.setenv("CUTLASS_AOT_TRACE_FILE", str(trace))
        report = build(loaded, cache_dir, jobs=2)
    finally:
        holder.kill()
        holder.wait()
    assert len(report.failed) == 2 and not report.built, report.as_dict()
    starts = [json.loads(line) for line in trace.read_text().splitlines()]
    starts = {e["key"]: e["t"] for e in starts if e["event"] == "compile-start"}
    assert set(starts) == set(keys)
    # One at a time, the second would start SECONDS after the first.
    assert abs(starts[keys[0]] - starts[keys[1]]) < SlowFailingFamily.SECONDS / 2, starts


# ---------------------------------------------- the bundled runtime's record
def _bundled_runtime(cache) -> tuple[str, dict]:
    (sha, rec), = read_index(cache)["runtimes"].items()
    return sha, rec


def test_a_no_bundle_build_keeps_the_bundled_runtime_record(built_cache, cache_copy):
    """`build --no-bundle-runtime` into a cache that bundles its runtime used to
    overwrite the runtime's record with path null: a service host without the
    DSL then found no runtime, though the file was still in the cache."""
    sha, before = _bundled_runtime(cache_copy)
    assert before["path"]
    key = built_cache.keys[0]
    shutil.rmtree(cache_copy / "entries" / key)  # one entry to publish again
    report = build([load_manifest(built_cache.manifest)], cache_copy, jobs=1, bundle_runtime=False)
    assert report.built == [key] and not report.failed, report.as_dict()
    after = read_index(cache_copy)["runtimes"][sha]
    assert after["path"] == before["path"], after
    assert CacheStore(cache_copy).runtime_file_ok(after)
    assert CacheStore(cache_copy).verify()["problems"] == []


def test_a_build_that_finds_everything_cached_restores_a_missing_bundled_runtime(built_cache, cache_copy):
    """Every entry verifies but runtime/ was emptied: the build used to report
    them all cached (exit 0) and leave a cache no DSL-less host can load. It
    puts the runtime back (from the installed DSL, under the index lock)."""
    sha, rec = _bundled_runtime(cache_copy)
    shutil.rmtree(cache_copy / "runtime" / sha)
    report = build([load_manifest(built_cache.manifest)], cache_copy, jobs=1)
    assert sorted(report.cached) == sorted(built_cache.keys) and not report.built, report.as_dict()
    assert CacheStore(cache_copy).runtime_file_ok(rec)
    assert any("runtime" in note for note in report.repaired), report.repaired
    assert CacheStore(cache_copy).verify()["problems"] == []


def test_entries_whose_missing_runtime_has_no_copy_are_rebuilt_and_bundle_it(built_cache, cache_copy,
                                                                             monkeypatch):
    """No installed DSL has the missing runtime (the store is told so): its
    entries are not counted cached; they are rebuilt, and the first rebuild
    bundles the runtime it links (the rest are then cached, as any whose
    runtime is back in place)."""
    from cutlass_aot.builder import store as store_mod  # noqa: PLC0415

    sha, rec = _bundled_runtime(cache_copy)
    shutil.rmtree(cache_copy / "runtime" / sha)
    monkeypatch.setattr(store_mod, "_installed_runtimes", lambda: [])
    report = build([load_manifest(built_cache.manifest)], cache_copy, jobs=2)
    assert report.built and not report.failed, report.as_dict()
    assert sorted(report.built + report.cached) == sorted(built_cache.keys), report.as_dict()
    index = read_index(cache_copy)
    assert {e["runtime"] for e in index["entries"].values()} == {sha}
    assert CacheStore(cache_copy).runtime_file_ok(index["runtimes"][sha])


def test_promote_reaches_the_compiled_kernel(tmp_path):
    """sm90_gemm's ``promote`` (r71) is compiled, not just keyed: a swapped
    decode tile built promoted and unpromoted gives two different artifacts,
    each recorded with its own value (a real compile on the CPU; the GPU
    tests check what the promoted kernel computes)."""
    manifest = tmp_path / "promote.yaml"
    manifest.write_text("""\
arch: sm_90a
kernels:
  - name: decode
    family: sm90_gemm
    params: {a: bf16, swap_ab: true, tile: 128x32, promote: [0, 16]}
""")
    cache = tmp_path / "cache"
    report = build([load_manifest(manifest)], cache, jobs=2)
    assert not report.failed and len(report.built) == 2, report.as_dict()
    entries = read_index(cache)["entries"].values()
    sha = {e["variant"]["promote"]: e["sha256"] for e in entries}
    assert set(sha) == {0, 16} and sha[0] != sha[16]
