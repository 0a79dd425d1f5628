"""The `cutlass-aot` command: exit codes (0 ok, 1 build/verify failure, 2 bad
input), --json documents and their keys, no tracebacks for user errors.

Driven in-process through click's CliRunner and, for the exit codes a shell
or CI sees, through a real ``python -m cutlass_aot.cli`` subprocess.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cutlass_aot import __version__
from cutlass_aot.cli import main
from tests.support import (
    TINY_VARIANTS,
    artifact,
    edit_index,
    flip_byte,
    load_index_json,
    run_cli,
    run_cli_json,
)

BUILD_KEYS = {"total", "built", "cached", "failed", "seconds", "ok", "failures", "repaired",
              "cache_dir", "manifests", "skipped_unsupported", "tables", "superseded"}
LS_ROW_KEYS = {"key", "arch", "signature", "variant", "size", "built_at"}
INFO_KEYS = {"cache_dir", "versions", "exists", "fastpath", "knob_problems", "entries", "signatures", "artifact_bytes",
             "runtime_bytes", "generation", "archs", "tables"}
VERIFY_KEYS = {"checked", "tables", "problems", "repaired", "ok", "cache_dir"}
GC_KEYS = {"removed", "bytes_freed", "kept", "ok", "table_rows_dropped"}
ERROR_KEYS = {"ok", "error", "message"}

BAD_MANIFESTS = {
    "unknown-key": "arch: sm_90a\nkernal: []\n",
    "yaml-syntax": "arch: sm_90a\nkernels: [\n",
    "bad-value": "arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: f8}\n",
    "python-tag": "arch: !!python/name:os.system x\nkernels: []\n",
    "empty": "",
}


@pytest.fixture
def runner(tmp_path, monkeypatch):
    # Never let a test fall back to the user's real cache directory.
    monkeypatch.setenv("CUTLASS_AOT_CACHE_DIR", str(tmp_path / "default-cache"))
    return CliRunner()


def invoke(runner: CliRunner, *args):
    return runner.invoke(main, [str(a) for a in args])


def parse(result) -> dict:
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON ({exc}): {result.stdout!r} / {result.stderr!r}") from None


def assert_user_error(result, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


# ----------------------------------------------------------------- CliRunner
def test_version_and_help(runner):
    result = invoke(runner, "--version")
    assert result.exit_code == 0 and __version__ in result.stdout
    result = invoke(runner, "--help")
    assert result.exit_code == 0
    for command in ("build", "ls", "info", "verify", "gc"):
        assert command in result.stdout


def test_build_json_summary(runner, cache_copy, built_cache):
    result = invoke(runner, "build", built_cache.manifest, "--cache-dir", cache_copy, "--json")
    assert result.exit_code == 0, result.output
    out = parse(result)
    assert BUILD_KEYS <= set(out), BUILD_KEYS - set(out)
    assert (out["total"], out["built"], out["cached"], out["failed"], out["ok"]) == (
        TINY_VARIANTS, 0, TINY_VARIANTS, 0, True)
    assert isinstance(out["seconds"], float) and out["seconds"] >= 0
    assert out["failures"] == [] and out["repaired"] == []
    assert out["manifests"] == [str(built_cache.manifest)] and out["cache_dir"] == str(cache_copy)
    assert out["skipped_unsupported"] == 0


def test_build_text_output(runner, cache_copy, built_cache):
    result = invoke(runner, "build", built_cache.manifest, "--cache-dir", cache_copy)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert sum(line.startswith("cached ") for line in lines) == TINY_VARIANTS
    assert f"{TINY_VARIANTS} variants: 0 built, {TINY_VARIANTS} cached, 0 failed" in lines[-1]


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
def test_build_bad_manifest_exits_2(runner, tmp_path, name):
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(BAD_MANIFESTS[name])
    cache = tmp_path / "cache"
    result = invoke(runner, "build", manifest, "--cache-dir", cache)
    assert_user_error(result, 2)
    assert result.stderr.startswith(f"error: {manifest}")
    assert not cache.exists()  # nothing is created before the manifest is valid
    result = invoke(runner, "build", manifest, "--cache-dir", cache, "--json")
    assert_user_error(result, 2)
    out = parse(result)
    assert set(out) == ERROR_KEYS
    assert out["ok"] is False and out["error"] == "ManifestError" and str(manifest) in out["message"]


def test_build_missing_manifest_exits_2(runner, tmp_path):
    result = invoke(runner, "build", tmp_path / "absent.yaml", "--cache-dir", tmp_path / "c")
    assert_user_error(result, 2)
    assert "no such manifest file" in result.stderr


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_exits_2(runner, built_cache, tmp_path, jobs):
    result = invoke(runner, "build", built_cache.manifest, "--cache-dir", tmp_path / "c", "--jobs", jobs)
    assert_user_error(result, 2)
    assert "must be at least 1" in result.output
    assert not (tmp_path / "c").exists()


def test_jobs_not_a_number_exits_2(runner, built_cache, tmp_path):
    result = invoke(runner, "build", built_cache.manifest, "--cache-dir", tmp_path / "c", "-j", "many")
    assert_user_error(result, 2)


def test_build_into_unwritable_location_exits_2(runner, built_cache, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke(runner, "build", built_cache.manifest, "--cache-dir", blocker / "cache", "--json")
    assert_user_error(result, 2)
    out = parse(result)
    assert out["error"] == "CacheError" and "cannot create cache directory" in out["message"]


def test_ls_json(runner, built_cache):
    result = invoke(runner, "ls", "--cache-dir", built_cache.path, "--json")
    assert result.exit_code == 0
    out = parse(result)
    assert set(out) == {"cache_dir", "entries", "tables"} and out["cache_dir"] == str(built_cache.path)
    assert out["tables"] == []
    index = load_index_json(built_cache.path)["entries"]
    assert [row["key"] for row in out["entries"]] == sorted(
        index, key=lambda k: (index[k]["signature_text"], k))
    for row in out["entries"]:
        assert set(row) == LS_ROW_KEYS
        rec = index[row["key"]]
        assert (row["signature"], row["variant"], row["size"], row["built_at"]) == (
            rec["signature_text"], rec["variant"], rec["size"], rec["built_at"])


def test_ls_text(runner, built_cache):
    result = invoke(runner, "ls", "--cache-dir", built_cache.path)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[-1] == f"{TINY_VARIANTS} entries in {built_cache.path}"
    assert lines[0] == f"sm_90a: {TINY_VARIANTS} entries"  # grouped by arch
    assert all("gemm[sm_90a](" in line and "tile=128x128" in line for line in lines[1:-1])


def test_ls_uses_the_cache_dir_knob(runner, built_cache, monkeypatch):
    monkeypatch.setenv("CUTLASS_AOT_CACHE_DIR", str(built_cache.path))
    out = parse(invoke(runner, "ls", "--json"))
    assert out["cache_dir"] == str(built_cache.path) and len(out["entries"]) == TINY_VARIANTS


def test_info_json(runner, built_cache):
    out = parse(invoke(runner, "info", "--cache-dir", built_cache.path, "--json"))
    assert set(out) == INFO_KEYS
    assert out["exists"] is True and out["entries"] == TINY_VARIANTS and out["signatures"] == 3
    index = load_index_json(built_cache.path)
    assert out["artifact_bytes"] == sum(r["size"] for r in index["entries"].values())
    assert out["runtime_bytes"] == sum(r["size"] for r in index["runtimes"].values())
    assert out["generation"] == index["generation"]
    assert out["versions"]["cutlass-aot"] == __version__
    assert {"nvidia-cutlass-dsl", "apache-tvm-ffi", "torch"} <= set(out["versions"])
    from cutlass_aot.run import fastpath  # noqa: PLC0415

    assert out["fastpath"] == fastpath.status()  # "on", or "off: <why>"


def test_info_on_a_cache_not_created_yet(runner, tmp_path):
    result = invoke(runner, "info", "--cache-dir", tmp_path / "nothing", "--json")
    assert result.exit_code == 0
    out = parse(result)
    assert out["exists"] is False and "entries" not in out
    assert not (tmp_path / "nothing").exists()  # info creates nothing


def test_verify_json(runner, built_cache):
    result = invoke(runner, "verify", "--cache-dir", built_cache.path, "--json")
    assert result.exit_code == 0
    out = parse(result)
    assert set(out) == VERIFY_KEYS
    assert (out["checked"], out["problems"], out["ok"], out["repaired"]) == (TINY_VARIANTS, [], True, False)


def test_verify_json_reports_problems_and_exits_1(runner, cache_copy, built_cache):
    key = built_cache.keys[2]
    flip_byte(artifact(cache_copy, key))
    result = invoke(runner, "verify", "--cache-dir", cache_copy, "--json")
    assert result.exit_code == 1
    out = parse(result)
    assert set(out) == VERIFY_KEYS and out["ok"] is False
    assert [p["what"] for p in out["problems"]] == [key]
    assert set(out["problems"][0]) == {"what", "problem"}
    text = invoke(runner, "verify", "--cache-dir", cache_copy)
    assert text.exit_code == 1 and f"BAD {key[:16]}" in text.stderr


def test_gc_json(runner, cache_copy, built_cache):
    result = invoke(runner, "gc", built_cache.manifest, "--cache-dir", cache_copy, "--json")
    assert result.exit_code == 0
    out = parse(result)
    assert set(out) == GC_KEYS
    assert out == {"removed": 0, "bytes_freed": 0, "kept": TINY_VARIANTS, "ok": True,
                   "table_rows_dropped": {}}


@pytest.mark.parametrize("args", [["gc"], ["gc", "--older-than", "3 weeks"], ["gc", "--older-than", "3w"]])
def test_gc_usage_errors_exit_2(runner, cache_copy, args):
    result = invoke(runner, *args, "--cache-dir", cache_copy)
    assert_user_error(result, 2)


def test_foreign_cache_exits_2(runner, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.json").write_text(json.dumps({"format": "something-else"}))
    for command in ("ls", "info", "verify"):
        result = invoke(runner, command, "--cache-dir", foreign, "--json")
        assert_user_error(result, 2)
        out = parse(result)
        assert out["error"] == "CacheError" and "not a cutlass-aot index" in out["message"]


def test_missing_cache_is_an_error_without_traceback(runner, tmp_path):
    for command in ("ls", "verify"):
        result = invoke(runner, command, "--cache-dir", tmp_path / "absent", "--json")
        assert result.exit_code != 0 and "Traceback" not in result.output
        out = parse(result)
        assert out["ok"] is False and "does not exist" in out["message"]
    assert not (tmp_path / "absent").exists()


# ---------------------------------------------------------------- subprocess
def test_subprocess_bad_manifest_exits_2_without_traceback(tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(BAD_MANIFESTS["unknown-key"])
    proc = run_cli("build", manifest, "--cache-dir", tmp_path / "c")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"error: {manifest}:2: the manifest: unknown key 'kernal'" in proc.stderr
    rc, out, err = run_cli_json("build", manifest, "--cache-dir", tmp_path / "c")
    assert rc == 2 and out["error"] == "ManifestError" and "Traceback" not in err


def test_subprocess_jobs_zero_exits_2(tmp_path, built_cache):
    proc = run_cli("build", built_cache.manifest, "--jobs", "0", "--cache-dir", tmp_path / "c")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "--jobs" in proc.stderr and "must be at least 1" in proc.stderr


def test_subprocess_gc_without_arguments_exits_2(built_cache):
    proc = run_cli("gc", "--cache-dir", built_cache.path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_subprocess_json_documents(built_cache):
    rc, ls, _ = run_cli_json("ls", "--cache-dir", built_cache.path)
    assert rc == 0 and len(ls["entries"]) == TINY_VARIANTS
    assert all(set(row) == LS_ROW_KEYS for row in ls["entries"])
    rc, info, _ = run_cli_json("info", "--cache-dir", built_cache.path)
    assert rc == 0 and set(info) == INFO_KEYS and info["entries"] == TINY_VARIANTS
    rc, verify, _ = run_cli_json("verify", "--cache-dir", built_cache.path)
    assert rc == 0 and set(verify) == VERIFY_KEYS and verify["ok"] is True


def test_build_notes_older_builds_of_the_variants_it_planned(cache_copy, built_cache):
    """After a kernel-source edit an incremental build adds new keys and leaves the older
    build's entries (same variants, other keys) until gc: build counts them and names the gc
    that removes them; after that gc there is nothing to note."""
    import shutil  # noqa: PLC0415 - local to this test

    key, old = built_cache.keys[0], "0" * 64
    shutil.copytree(cache_copy / "entries" / key, cache_copy / "entries" / old)
    edit_index(cache_copy, lambda d: d["entries"].__setitem__(old, dict(
        d["entries"][key], key=old, path=f"entries/{old}/kernel.so", kernel_sources="1" * 64,
        built_at="2026-01-01T00:00:00+00:00")))
    proc = run_cli("build", built_cache.manifest, "--cache-dir", cache_copy)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert ("note: 1 entries are older builds of variants this run planned" in err
            and f"cutlass-aot gc {built_cache.manifest} --cache-dir {cache_copy}" in err), err
    rc, out, _ = run_cli_json("build", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0 and out["superseded"] == 1 and out["cached"] == TINY_VARIANTS
    rc, out, _ = run_cli_json("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0 and out["removed"] == 1
    proc = run_cli("build", built_cache.manifest, "--cache-dir", cache_copy)
    assert proc.returncode == 0 and "older builds" not in proc.stderr
    assert run_cli_json("build", built_cache.manifest, "--cache-dir", cache_copy)[1]["superseded"] == 0


def test_subprocess_build_verify_gc_exit_codes(cache_copy, built_cache):
    rc, out, _ = run_cli_json("build", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0 and BUILD_KEYS <= set(out) and out["ok"] is True and out["cached"] == TINY_VARIANTS
    flip_byte(artifact(cache_copy, built_cache.keys[0]))
    rc, out, _ = run_cli_json("verify", "--cache-dir", cache_copy)
    assert rc == 1 and out["ok"] is False
    rc, out, _ = run_cli_json("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert rc == 0 and set(out) == GC_KEYS


def test_subprocess_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and __version__ in proc.stdout
