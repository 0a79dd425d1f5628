"""CLI edges a review and a new user hit: knobs that do not parse, --arch
that matches nothing, gc on odd caches (no entries/, read-only, leftover temp
index files), the planned-count guard, values printed as the manifest writes
them, and plugin families checked when they load.

Real subprocesses for exit codes; no compiles except where a build must run.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cutlass_aot.builder.family import load_family
from cutlass_aot.errors import ManifestError
from tests.support import (
    RESIDUAL_ONLY_MANIFEST,
    cli_argv,
    make_tree_readonly,
    make_tree_writable,
    run_cli,
    run_cli_json,
    subprocess_env,
)

NO_CAPS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


def _no_traceback(proc):
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("knob, value", [("CUTLASS_AOT_JOBS", "abc"), ("CUTLASS_AOT_JOBS", "0"),
                                         ("CUTLASS_AOT_LOCK_TIMEOUT", "soon"),
                                         ("CUTLASS_AOT_LOCK_TIMEOUT", "nan"),
                                         ("CUTLASS_AOT_MAX_VARIANTS", "lots")])
def test_knob_that_does_not_parse_exits_2_naming_it(built_cache, tmp_path, knob, value):
    proc = run_cli("build", built_cache.manifest, "--cache-dir", tmp_path / "c",
                   env=subprocess_env(**{knob: value}))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    _no_traceback(proc)
    assert knob in proc.stderr


@pytest.mark.parametrize("knob, value", [("CUTLASS_AOT_FASTPATH", "maybe"),
                                         ("CUTLASS_AOT_TRUST_ANY_OWNER", "true"),
                                         ("CUTLASS_AOT_ALLOW_PATH_LOAD", "yes"),
                                         ("CUTLASS_AOT_ON_MISS", "fallback"),
                                         ("CUTLASS_AOT_AUTOTUNE", "always"),
                                         ("CUTLASS_AOT_REGISTRY_TIMEOUT", "inf"),
                                         ("CUTLASS_AOT_REGISTRY_USER", "u")])
def test_info_names_every_bad_knob_and_exits_2(built_cache, knob, value):
    """info is where a user looks for what is wrong: it prints everything it
    can, names each knob a reader would refuse, and exits 2 (before r50 a bad
    FASTPATH read as "off" with exit 0, and TRUST_ANY_OWNER=true silently as off)."""
    env = {knob: value}
    if knob == "CUTLASS_AOT_REGISTRY_USER":  # the pair without REGISTRY_HOST
        env["CUTLASS_AOT_REGISTRY_PASSWORD"] = "p"
    proc = run_cli("info", "--cache-dir", built_cache.path, env=subprocess_env(**env))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    _no_traceback(proc)
    assert "bad knob" in proc.stderr and knob.rsplit("_", 1)[0] in proc.stderr
    assert "entries" in proc.stdout  # the rest of the report still printed
    rc, out, _ = run_cli_json("info", "--cache-dir", built_cache.path, env=subprocess_env(**env))
    assert rc == 2 and len(out["knob_problems"]) == 1 and "CUTLASS_AOT_" in out["knob_problems"][0]
    proc = run_cli("info", "--cache-dir", built_cache.path, env=subprocess_env())
    assert proc.returncode == 0 and "bad knob" not in proc.stderr


def test_a_flag_knob_that_means_nothing_is_refused_where_it_is_read(monkeypatch):
    """TRUST_ANY_OWNER and ALLOW_PATH_LOAD read only "1" as on: "true" was
    silently off. The readers now refuse it (the loader's CacheError paths
    call them), so the user learns the value did nothing."""
    from cutlass_aot import knobs  # noqa: PLC0415
    from cutlass_aot.errors import UsageError  # noqa: PLC0415

    for name, reader in (("TRUST_ANY_OWNER", knobs.trust_any_owner),
                         ("ALLOW_PATH_LOAD", knobs.allow_path_load)):
        with knobs.override(**{name: "true"}), pytest.raises(UsageError, match=name):
            reader()
        with knobs.override(**{name: "1"}):
            assert reader() is True
        with knobs.override(**{name: "0"}):
            assert reader() is False
        with knobs.override(**{name: None}):
            assert reader() is False


def test_arch_matching_no_manifest_exits_2_listing_archs(built_cache, tmp_path):
    proc = run_cli("build", built_cache.manifest, "--cache-dir", tmp_path / "c", "--arch", "sm_99z")
    assert proc.returncode == 2
    _no_traceback(proc)
    assert "sm_99z" in proc.stderr and "sm_90a" in proc.stderr
    assert not (tmp_path / "c").exists()
    rc, out, _ = run_cli_json("build", built_cache.manifest, "--cache-dir", tmp_path / "c", "--arch", "sm_99z")
    assert rc == 2 and out["error"] == "UsageError" and "sm_90a" in out["message"]


def test_gc_on_a_cache_without_entries_dir(cache_copy, built_cache):
    shutil.rmtree(cache_copy / "entries")
    proc = run_cli("gc", built_cache.manifest, "--cache-dir", cache_copy)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_gc_on_a_read_only_cache_exits_2_without_traceback(cache_copy, built_cache):
    make_tree_readonly(cache_copy)
    try:
        proc = subprocess.run([*NO_CAPS, *cli_argv("gc", "--older-than", "0s", "--cache-dir", cache_copy)],
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
        _no_traceback(proc)
        assert "not writable" in proc.stderr
        proc = subprocess.run([*NO_CAPS, *cli_argv("verify", "--repair", "--cache-dir", cache_copy)],
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "not writable" in proc.stderr, proc.stderr[-2000:]
    finally:
        make_tree_writable(cache_copy)


def test_gc_sweeps_stale_temp_index_files(cache_copy, built_cache):
    old = cache_copy / ".index.json.0123abcd.tmp"
    fresh = cache_copy / ".index.json.fedc3210.tmp"
    old.write_text("{}")
    fresh.write_text("{}")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    proc = run_cli("gc", built_cache.manifest, "--cache-dir", cache_copy)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not old.exists() and fresh.exists()


GRID_MANIFEST = """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: [f16, bf16]
      tile: [64x128, 64x256, 128x64, 128x128, 128x256, 256x128]
      cluster: [1x1, 2x1, 1x2, 2x2]
      swizzle: [1, 2, 4, 8]
"""  # 2 * 6 * 4 * 4 = 192 variants


def test_plan_above_the_limit_is_refused_unless_confirmed(tmp_path):
    manifest = tmp_path / "grid.yaml"
    manifest.write_text(GRID_MANIFEST)
    cache = tmp_path / "c"
    env = subprocess_env(CUTLASS_AOT_MAX_VARIANTS="100")
    proc = run_cli("build", manifest, "--cache-dir", cache, env=env)
    assert proc.returncode == 2
    _no_traceback(proc)
    assert "192 variants" in proc.stderr and "--yes" in proc.stderr and "CUTLASS_AOT_MAX_VARIANTS" in proc.stderr
    proc = run_cli("build", manifest, "--cache-dir", cache, "--max-variants", "191")
    assert proc.returncode == 2 and "192 variants" in proc.stderr
    assert not cache.exists()  # refused before anything was created


def test_planned_count_is_printed_before_compiling(cache_copy, built_cache):
    proc = run_cli("build", built_cache.manifest, "--cache-dir", cache_copy, "--max-variants", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[0].startswith("planned 3 variants from 1 manifest(s)")


def test_text_lines_print_values_as_the_manifest_writes_them(cache_copy, built_cache, tmp_path):
    proc = run_cli("build", built_cache.manifest, "--cache-dir", cache_copy)
    assert proc.returncode == 0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("cached")]
    assert len(lines) == 3
    for ln in lines:
        assert "None" not in ln and "False" not in ln and "True" not in ln, ln
        assert "b=null" in ln and ("with_c=false" in ln or "with_c=true" in ln), ln


def test_build_no_numpy_warning_on_stderr(cache_dir, tmp_path):
    manifest = tmp_path / "residual.yaml"
    manifest.write_text(RESIDUAL_ONLY_MANIFEST)
    proc = run_cli("build", manifest, "--cache-dir", cache_dir, "-j", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NumPy" not in proc.stderr and "UserWarning" not in proc.stderr, proc.stderr


# ------------------------------------------------------ plugin declarations
def _family_module(tmp_path, monkeypatch, body: str) -> str:
    pkg = tmp_path / "plugfam"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from cutlass_aot.builder.family import KernelFamily\n"
        "from cutlass_aot.signature import Signature\n"
        "class Fam(KernelFamily):\n"
        "    archs = ('sm_90a',)\n"
        + "".join(f"    {line}\n" for line in body.splitlines()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plugfam", raising=False)  # each test's own module
    importlib.invalidate_caches()
    return "plugfam:Fam"


GOOD = "abi = 'user:x-v1'\nsymbol = 'x'\nparams = {'n': (1, 2)}\ndefaults = {'n': 1}"


@pytest.mark.parametrize("body, problem", [
    (GOOD.replace("defaults = {'n': 1}", "defaults = {'n': 3}"), "not one of the allowed values"),
    (GOOD.replace("defaults = {'n': 1}", "defaults = {'n': True}"), "not one of the allowed values"),
    (GOOD.replace("defaults = {'n': 1}", "defaults = {'m': 1}"), "not a parameter"),
    (GOOD.replace("'user:x-v1'", "'my-abi'"), "not one the run side can call"),
    (GOOD.replace("'user:x-v1'", "'user:'"), "not one the run side can call"),
    (GOOD.replace("symbol = 'x'\n", ""), "symbol"),
    (GOOD.replace("(1, 2)", "(1.5,)"), "values must be str, int, bool or None"),
    (GOOD.replace("(1, 2)", "()"), "non-empty tuple"),
])
def test_plugin_family_declaration_is_checked_at_load(tmp_path, monkeypatch, body, problem):
    ref = _family_module(tmp_path, monkeypatch, body)
    with pytest.raises(ManifestError, match=problem):
        load_family(ref)


def test_a_correct_plugin_family_loads(tmp_path, monkeypatch):
    ref = _family_module(tmp_path, monkeypatch, GOOD)
    assert load_family(ref).symbol == "x"
    assert load_family("tests.families:ToyFamily").symbol == "toy"
    assert load_family("sm90_gemm").symbol == "gemm"


def test_bad_plugin_family_in_a_manifest_exits_2(tmp_path):
    pkg = tmp_path / "badfam"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from cutlass_aot.builder.family import KernelFamily\n"
        "class Fam(KernelFamily):\n"
        "    archs = ('sm_90a',)\n    abi = 'user:b-v1'\n    params = {'n': (1, 2)}\n")
    manifest = tmp_path / "m.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: badfam:Fam\n    params: {n: 1}\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_cli("build", manifest, "--cache-dir", tmp_path / "c", env=env)
    assert proc.returncode == 2 and "symbol" in proc.stderr, proc.stderr[-2000:]
    _no_traceback(proc)


def test_ls_prints_every_parameter_of_a_plugin_family(cache_copy, built_cache):
    key = built_cache.keys[0]

    def to_plugin(d):
        d["entries"][key]["variant"] = {"dtype": "f16", "threads": 256, "fast": False, "extra": None}
    from tests.support import edit_index  # noqa: PLC0415

    edit_index(cache_copy, to_plugin)
    proc = run_cli("ls", "--cache-dir", cache_copy)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(key[:12]))
    assert "dtype=f16 extra=null fast=false threads=256" in line
    assert "{" not in line
    json.loads(run_cli("ls", "--json", "--cache-dir", cache_copy).stdout)


@pytest.mark.parametrize("case", ["nan-budget", "out-dir-missing", "junk-log", "deep-shapes"])
def test_tune_refuses_bad_arguments_before_it_needs_a_gpu(built_cache, tmp_path, case):
    """Each of these once passed (nan: no budget at all), crashed after the
    whole tune (--out into a missing dir), blamed the wrong flag (a log of
    junk: "give --from-log"), or raised RecursionError; now exit 2 at once."""
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- {a: bf16, shapes: [[128, 256, 256]]}\n")
    args = ["--shapes", shapes]
    want = {"nan-budget": "not nan", "out-dir-missing": "not a writable directory",
            "junk-log": "2 line(s) skipped", "deep-shapes": "nested too deeply"}[case]
    if case == "nan-budget":
        args += ["--budget-s", "nan"]
    elif case == "out-dir-missing":
        args += ["--out", tmp_path / "nowhere" / "t.json"]
    elif case == "junk-log":
        log = tmp_path / "junk.jsonl"
        log.write_text('not json\n{"v": true}\n')
        args = ["--from-log", log]
    else:
        deep = tmp_path / "deep.json"
        deep.write_text("[" * 100000 + "]" * 100000)
        args = ["--shapes", deep]
    proc = run_cli("tune", *args, "--cache-dir", built_cache.path)
    _no_traceback(proc)
    assert proc.returncode == 2 and want in proc.stderr, proc.stderr[-800:]


@pytest.mark.parametrize("cls, method", [
    ("SignatureRaisesFamily", "signature"),
    ("SignatureNoneFamily", "signature"),
    ("RejectRaisesFamily", "reject"),
    ("AbiForRaisesFamily", "abi_for"),
    ("MissingSourceFamily", "sources_digest"),
    ("BuildCostRaisesFamily", "build_cost"),
])
def test_a_family_method_that_raises_is_a_manifest_error_naming_it(tmp_path, cls, method):
    """A user family's signature(), reject(), abi_for(), sources or build_cost
    that raises (or returns no Signature) used to surface as a traceback from
    the plan, exit 1. It is a ManifestError: exit 2, the family, the method."""
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415

    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"arch: sm_90a\nkernels:\n  - family: tests.families:{cls}\n"
                        "    params: {x: [1, 2]}\n")
    with pytest.raises(ManifestError, match=rf"tests\.families:{cls}.*{method}\(\)") as info:
        load_manifest(manifest)
    assert info.value.data["method"] == method and info.value.data["field"] == "family"
    args = ["build", manifest, "--cache-dir", tmp_path / "c", "--shard", "1/1"]
    proc = run_cli(*args)
    assert proc.returncode == 2 and f"{method}()" in proc.stderr and cls in proc.stderr, proc.stderr[-2000:]
    _no_traceback(proc)


@pytest.mark.parametrize("how", ["nul", "loop"])
def test_a_tuning_path_that_cannot_resolve_is_a_manifest_error(tmp_path, how):
    """`tuning:` with a NUL byte (ValueError) or through a symlink loop
    (RuntimeError on Python 3.11) used to crash the manifest load."""
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415

    if how == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        value = "a/table.json"
    else:
        value = '"t\\0able.json"'
    manifest = tmp_path / "m.yaml"
    manifest.write_text(RESIDUAL_ONLY_MANIFEST + f"tuning: {value}\n")
    with pytest.raises(ManifestError, match="tuning") as info:
        load_manifest(manifest)
    assert info.value.data["field"] == "tuning"
    proc = run_cli("build", manifest, "--cache-dir", tmp_path / "c")
    assert proc.returncode == 2 and "tuning" in proc.stderr, proc.stderr[-2000:]
    _no_traceback(proc)


@pytest.mark.parametrize("which", ["source", "--cache-dir"])
def test_merge_with_a_symlink_loop_exits_2_naming_it(tmp_path, which):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop, fine = tmp_path / "a" / "cache", tmp_path / "fine"
    src, dst = (loop, fine) if which == "source" else (fine, loop)
    proc = run_cli("merge", src, "--cache-dir", dst)
    _no_traceback(proc)
    assert proc.returncode == 2 and str(loop) in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("where", ["directory", "missing-dir"])
def test_a_trace_file_builders_cannot_append_to_exits_2_naming_the_knob(built_cache, tmp_path, where):
    """CUTLASS_AOT_TRACE_FILE naming a directory, or a file in a directory that
    does not exist, used to crash the build with a traceback at its first trace
    line; it is a UsageError naming the knob, and `info` lists it."""
    value = str(tmp_path if where == "directory" else tmp_path / "no-such-dir" / "trace.jsonl")
    env = subprocess_env(CUTLASS_AOT_TRACE_FILE=value)
    manifest = tmp_path / "residual.yaml"
    manifest.write_text(RESIDUAL_ONLY_MANIFEST)
    proc = run_cli("build", manifest, "--cache-dir", tmp_path / "c", env=env)
    assert proc.returncode == 2 and "CUTLASS_AOT_TRACE_FILE" in proc.stderr, proc.stderr[-2000:]
    _no_traceback(proc)
    proc = run_cli("info", "--cache-dir", built_cache.path, env=env)
    assert proc.returncode == 2 and "CUTLASS_AOT_TRACE_FILE" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("what", ["/dev/zero", "big", "dir-fifo"])
def test_a_manifest_that_is_no_regular_file_or_too_large_exits_2_at_once(tmp_path, what):
    """`build /dev/zero` used to read forever; a huge file was read whole."""
    if what == "big":
        path = tmp_path / "big.yaml"
        path.write_bytes(RESIDUAL_ONLY_MANIFEST.encode() + b"#" * (9 << 20) + b"\n")
    elif what == "dir-fifo":
        path = tmp_path / "fifo.yaml"
        os.mkfifo(path)
    else:
        path = what
    t0 = time.monotonic()
    proc = run_cli("build", path, "--cache-dir", tmp_path / "c", timeout=60)
    assert proc.returncode == 2 and str(path) in proc.stderr, proc.stderr[-2000:]
    _no_traceback(proc)
    assert time.monotonic() - t0 < 30
    if what == "dir-fifo":  # a FIFO no process writes: read as empty at once, not waited on
        assert "a pipe with nothing written to it" in proc.stderr, proc.stderr


def test_a_manifest_piped_in_builds_and_an_endless_pipe_is_cut_at_the_cap(tmp_path):
    """r51: r50's regular-file rule also refused `build <(generate)` and
    `build /dev/stdin` (a pipe), which CI scripts use. A pipe is read once, to
    its end or to the 8 MiB cap."""
    cache = tmp_path / "c"
    proc = subprocess.run(cli_argv("build", "--json", "--cache-dir", cache, "/dev/stdin"),
                          input=RESIDUAL_ONLY_MANIFEST, env=subprocess_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["built"] == 1 and not report["failed"], report
    endless = subprocess.Popen(["yes", "# filler"], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run(cli_argv("build", "--cache-dir", cache, "/dev/stdin"),
                              stdin=endless.stdout, env=subprocess_env(), capture_output=True,
                              text=True, timeout=120)
    finally:
        endless.kill()
        endless.wait()
    assert proc.returncode == 2 and "more than the 8388608 a manifest may have" in proc.stderr, \
        proc.stderr[-2000:]
    _no_traceback(proc)


def test_combinations_dropped_by_skip_unsupported_are_said_not_silent(tmp_path):
    """r50 review: an entry whose every combination skip_unsupported drops built
    nothing and printed nothing about it (only --json carried a count)."""
    manifest = tmp_path / "skipall.yaml"
    manifest.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    skip_unsupported: true\n"
                        "    params: {a: bf16, b: f16}\n")
    proc = run_cli("build", manifest, "--cache-dir", tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "note: 1 combination(s) skipped as unsupported" in proc.stderr
    assert "A and B must have the same dtype" in proc.stderr and "skipall.yaml:3" in proc.stderr


@pytest.mark.parametrize("delay", [0.05, 0.5])
def test_ctrl_c_mid_build_exits_130_in_one_line_and_a_rerun_finishes(tmp_path, delay):
    """r51: Ctrl-C (SIGINT to the terminal's process group) mid-build printed a
    KeyboardInterrupt traceback from every compile worker and click's
    "Aborted!", and exited 1. Now the workers leave SIGINT to the parent,
    which stops them, removes their work dirs and exits 130 in one line; the
    same command run again builds the rest."""
    from tests.support import TINY_MANIFEST, TINY_VARIANTS  # noqa: PLC0415

    manifest, cache = tmp_path / "tiny.yaml", tmp_path / "c"
    manifest.write_text(TINY_MANIFEST)
    proc = subprocess.Popen(cli_argv("build", "--jobs", "2", "--cache-dir", cache, manifest),
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            # a shell runs a background job with SIGINT ignored, and a child
                            # inherits that: give the CLI a terminal's default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stderr.readline()  # "planned N variants ...": compiles start now
    assert first.startswith("planned"), first
    # 0.05 s: the workers are starting (r51 review: before they ignored
    # SIGINT, each printed a traceback); 0.5 s: importing the DSL or compiling.
    # Twice, as an impatient user presses it: the second waits for the cleanup.
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in out + err and "Aborted" not in err, err[-3000:]
    assert err.strip() == ("interrupted: what finished before is kept; run the command again to "
                           "finish the rest"), err
    assert not list((cache / "tmp").glob("build-*")), "the killed compiles' work dirs are removed"
    again = run_cli("build", "--json", "--cache-dir", cache, manifest)
    assert again.returncode == 0, again.stderr[-2000:]
    report = json.loads(again.stdout)
    assert report["built"] + report["cached"] == TINY_VARIANTS and not report["failed"], report
    assert run_cli("verify", "--cache-dir", cache).returncode == 0
