"""The run side on a CPU machine: import contract, opening and loading real
artifacts with tvm_ffi, argument errors, not-found messages, trust and
integrity checks before dlopen, read-only caches, version skew, and the
container flow (build, freeze, load from another process).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import cutlass_aot
from cutlass_aot import ArgumentError, CacheError, IntegrityError, KernelNotFoundError
from cutlass_aot.layout import LAYOUT_VERSION
from cutlass_aot.run import occupancy, select
from cutlass_aot.run.load import Cache
from cutlass_aot.run.select import check_no_internal_overlap
from cutlass_aot.signature import Signature, splitk_tail_tiles
from tests.support import (
    TINY_VARIANTS,
    artifact,
    copy_cache,
    edit_index,
    flip_byte,
    load_index_json,
    make_tree_readonly,
    make_tree_writable,
    mapped_files,
    run_cli,
    run_python,
    subprocess_env,
    tree_snapshot,
    truncate,
)

FORBIDDEN_PREFIXES = ("cutlass.", "cutlass_aot.builder", "cutlass_aot.kernels", "cutlass_aot.cli")

RUN_SIDE_SCRIPT = r"""
import json, sys
import cutlass_aot
cache = cutlass_aot.open_cache(sys.argv[1])
fn = cache.function(sys.argv[2])
gemm = cache.gemm                        # the dispatch module is run side too
print(json.dumps({"fn": type(fn).__module__ + "." + type(fn).__name__,
                  "runner": type(gemm.runner).__name__,
                  "modules": sorted(sys.modules)}))
"""


def forbidden(modules) -> list[str]:
    return sorted(m for m in modules if m == "cutlass" or m.startswith(FORBIDDEN_PREFIXES))


# ------------------------------------------------------------ (a) imports
def test_fresh_interpreter_loads_without_the_dsl_or_build_side(built_cache):
    before = tree_snapshot(built_cache.path)
    proc = run_python(RUN_SIDE_SCRIPT, built_cache.path, built_cache.keys[0])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fn"].startswith("tvm_ffi") and out["runner"] == "GemmRunner"
    assert "cutlass_aot.run.load" in out["modules"] and "tvm_ffi" in out["modules"]
    assert forbidden(out["modules"]) == []
    assert tree_snapshot(built_cache.path) == before  # a reader writes nothing


def test_forbidden_module_check_would_see_the_dsl():
    """Control for the test above: importing the build worker's DSL is detected."""
    proc = run_python("import json, sys, cutlass.cute; print(json.dumps(sorted(sys.modules)))")
    assert proc.returncode == 0, proc.stderr
    found = forbidden(json.loads(proc.stdout.splitlines()[-1]))
    assert "cutlass.cute" in found


def test_import_creates_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(CUTLASS_AOT_CACHE_DIR=None, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    proc = run_python("import cutlass_aot, cutlass_aot.run.dispatch", env=env)
    assert proc.returncode == 0, proc.stderr
    assert list(home.iterdir()) == []


# ------------------------------------------------------ (b) open and load
def test_open_cache_signatures_and_entries(built_cache):
    cache = cutlass_aot.open_cache(built_cache.path)
    assert cutlass_aot.open_cache(built_cache.path) is cache  # opened once per process
    index = load_index_json(built_cache.path)["entries"]
    assert set(cache.entries) == set(built_cache.keys) and cache.unusable == {}
    sigs = cache.signatures()
    assert [str(s) for s in sigs] == sorted(r["signature_text"] for r in index.values())
    assert all(isinstance(s, Signature) and s.op == "gemm" and s.arch == "sm_90a" for s in sigs)
    for sig, entries in cache.by_signature.items():
        assert len(entries) == 1
        assert str(sig) == index[entries[0].key]["signature_text"]
    with_c = [s for s in sigs if s.get("c") is not None]
    assert len(with_c) == 1 and with_c[0].get("c") == "bf16"
    assert {s.get("b_major") for s in sigs} == {"k", "n"}


def test_artifact_loads_with_tvm_ffi_and_refuses_cpu_tensors(built_cache, load_spy):
    import tvm_ffi  # noqa: PLC0415 - imported where the test needs it, like the loader does

    cache = Cache(built_cache.path)
    for n, key in enumerate(built_cache.keys, 1):
        fn = cache.function(key)
        assert isinstance(fn, tvm_ffi.Function)
        assert cache.function(key) is fn  # loaded once
        assert len(load_spy.calls) == n
    key = next(k for k, e in cache.entries.items() if e.signature.get("c") is None)
    a = torch.zeros(128, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 128, dtype=torch.bfloat16)
    d = torch.zeros(128, 128, dtype=torch.bfloat16)
    with pytest.raises(Exception, match="cuda") as info:  # the artifact's own device check
        cache.function(key)(a, b, d, 1.0, 132)
    assert not isinstance(info.value, cutlass_aot.CutlassAotError)


@pytest.mark.parametrize("how", ["cache.gemm", "GemmRunner"])
def test_gemm_runner_with_cpu_tensors_raises_argument_error(built_cache, how):
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    cache = Cache(built_cache.path)
    runner = cache.gemm if how == "cache.gemm" else GemmRunner(cache)
    a = torch.zeros(128, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 128, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="cuda") as info:
        runner(a, b)
    assert "devices" in info.value.data and info.value.exit_code == 2
    with pytest.raises(ArgumentError, match="cuda"):
        runner(a, b, torch.empty(128, 128, dtype=torch.bfloat16), c=torch.zeros(128, 128), beta=0.5)
    assert isinstance(info.value, ValueError)  # callers may catch ValueError


@pytest.mark.parametrize("fast", [True, False])
def test_the_entry_refuses_calls_autograd_would_differentiate(built_cache, fast):
    """r50 review: cache.gemm wrote out behind autograd's back: with grad mode on,
    an operand that requires grad came back with no grad_fn, and an out that
    autograd had saved was overwritten unseen, so backward gave wrong
    gradients with no error. It is refused now, before anything else (so on
    CPU tensors too), as torch.mm(out=) and the custom op refuse it."""
    from torch.autograd import forward_ad as fwad  # noqa: PLC0415

    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    gemm = GemmRunner(Cache(built_cache.path), fast=fast).entry()
    a, b = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    out = torch.zeros(128, 128, dtype=torch.bfloat16)
    for kwargs in ({"a": a.clone().requires_grad_()}, {"b": b.clone().requires_grad_()},
                   {"out": out.clone().requires_grad_()},
                   {"c": out.clone().requires_grad_()},
                   {"bias": torch.zeros(128, dtype=torch.bfloat16, requires_grad=True)}):
        args = {"a": a, "b": b, "out": out} | kwargs
        with pytest.raises(ArgumentError, match="no_grad") as info:
            gemm(args.pop("a"), args.pop("b"), args.pop("out"), **args)
        assert info.value.reason == "autograd"
        with torch.no_grad(), pytest.raises(ArgumentError, match="cuda"):  # past the guard
            args = {"a": a, "b": b, "out": out} | kwargs
            gemm(args.pop("a"), args.pop("b"), args.pop("out"), **args)
    with fwad.dual_level(), pytest.raises(ArgumentError, match="forward-AD"):
        gemm(a, b, out)
    with pytest.raises(ArgumentError, match="cuda"):  # nothing requires grad: no refusal
        gemm(a, b, out)


@pytest.mark.parametrize("fast", [True, False])
def test_an_act_or_beta_of_the_wrong_type_is_an_argument_error(built_cache, fast):
    """r50 review: act=["relu"] raised a bare TypeError (unhashable, from the
    memo lookup), beta=torch.ones(2) a bare RuntimeError (its truth value)."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    gemm = GemmRunner(Cache(built_cache.path), fast=fast).entry()
    a, b = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    out = torch.zeros(128, 128, dtype=torch.bfloat16)
    for act in (["relu"], {}):
        with pytest.raises(ArgumentError, match="act must be one of"):
            gemm(a, b, out, act=act)
    with pytest.raises(ArgumentError, match="beta must be a real number"):
        gemm(a, b, out, c=out.clone(), beta=torch.ones(2))


def test_a_negative_bit_view_is_refused_not_read_unnegated(built_cache):
    """r50 review: a lazily negated view (torch._neg_view) reached the kernel as
    its raw memory: (-a) @ b came back a @ b."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    runner = GemmRunner(Cache(built_cache.path), fast=False)
    a, b = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="negative-bit view"):
        runner._signature(torch._neg_view(a), b, torch.zeros(128, 128, dtype=torch.bfloat16), None,
                          None, None)


@pytest.mark.parametrize("fast", [True, False])
def test_the_entry_checks_the_negative_bit_before_its_memo(built_cache, fast):
    """r51: the check above ran at resolution only, so a layout already
    memoized (or registered with the C++ entry, which reads DLPack's memory,
    not the bit) served a neg view unnegated. The entry checks every call
    first: CPU tensors get the neg-bit error, not the device one after it."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    gemm = GemmRunner(Cache(built_cache.path), fast=fast).entry()
    a, b = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    out = torch.zeros(128, 128, dtype=torch.bfloat16)
    bias = torch.zeros(128, dtype=torch.bfloat16)
    for name, args, kwargs in (
            ("a", (torch._neg_view(a), b, out), {}),
            ("b", (a, torch._neg_view(b), out), {}),
            ("out", (a, b, torch._neg_view(out)), {}),
            ("c", (a, b, out), {"c": torch._neg_view(out.clone())}),
            ("bias", (a, b, out), {"bias": torch._neg_view(bias)}),
            ("a", (torch._neg_view(a), b), {})):  # no out: checked before one is allocated
        with pytest.raises(ArgumentError, match=f"{name} is a negative-bit view") as info:
            gemm(*args, **kwargs)
        assert info.value.reason == "neg-view" and info.value.tensor == name
    with pytest.raises(ArgumentError, match="cuda"):  # no neg bit: past the check
        gemm(a, b, out, c=out.clone(), bias=bias)


def test_default_cache_gemm_uses_the_knob(built_cache, monkeypatch):
    monkeypatch.setenv("CUTLASS_AOT_CACHE_DIR", str(built_cache.path))
    monkeypatch.setattr(cutlass_aot, "_default_runner", None)
    with pytest.raises(ArgumentError, match="cuda"):
        cutlass_aot.gemm(torch.zeros(8, 8, dtype=torch.float16), torch.zeros(8, 8, dtype=torch.float16))
    assert cutlass_aot._default_runner.runner.cache.path == built_cache.path


# ------------------------------------------------------------ (c) not found
def test_kernel_not_found_names_signature_nearest_and_fix(built_cache):
    cache = Cache(built_cache.path)
    sig = Signature.make("gemm", "sm_90a", {
        "a": "f16", "b": "f16", "d": "f16", "c": None, "a_major": "k", "b_major": "k",
        "d_major": "n", "rank": 2, "align": 16})
    err = cache.not_found(sig)
    assert isinstance(err, KernelNotFoundError) and isinstance(err, LookupError)
    msg = str(err)
    assert str(sig) in msg and str(built_cache.path) in msg
    assert "nearest signatures in this cache:" in msg
    nearest = cache.nearest(sig)
    assert err.nearest == [str(s) for s in nearest] and len(nearest) == 3
    for s in nearest:
        assert f"  {s}" in msg
    # the closest is the one differing only in dtypes' neighbour: bf16, b_major k, no c
    assert nearest[0].get("b_major") == "k" and nearest[0].get("c") is None
    assert "cutlass-aot build" in msg
    assert "a: f16" in msg and "c: null" in msg and "arch sm_90a" in msg
    assert err.signature == str(sig) and err.cache_dir == str(built_cache.path)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is KernelNotFoundError and str(clone) == msg and clone.nearest == err.nearest


def test_kernel_not_found_for_an_unknown_key(built_cache):
    cache = Cache(built_cache.path)
    with pytest.raises(KernelNotFoundError, match="not in the index"):
        cache.function("0" * 64)


def test_not_found_in_an_empty_cache(cache_copy):
    edit_index(cache_copy, lambda d: d["entries"].clear())
    cache = Cache(cache_copy)
    sig = Signature.make("gemm", "sm_90a", {"a": "bf16"})
    msg = str(cache.not_found(sig))
    assert "the cache has no usable entries" in msg and "cutlass-aot build" in msg


# ------------------------------------------------------------------ (d) trust
@pytest.mark.parametrize("target", [".", "index.json", "entries"])
def test_world_writable_cache_is_refused(cache_copy, target):
    path = cache_copy / target
    os.chmod(path, os.stat(path).st_mode | 0o002)
    with pytest.raises(CacheError, match="world-writable") as info:
        Cache(cache_copy)
    assert not isinstance(info.value, IntegrityError)
    assert "chmod o-w" in str(info.value)


def test_sticky_world_writable_cache_is_refused(cache_copy):
    os.chmod(cache_copy, 0o1777)
    with pytest.raises(CacheError, match="world-writable"):
        Cache(cache_copy)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_cache_owned_by_a_stranger_is_refused_unless_trusted(cache_copy, monkeypatch):
    os.chown(cache_copy / "index.json", 4242, 4242)
    with pytest.raises(CacheError, match="owned by uid 4242"):
        Cache(cache_copy)
    monkeypatch.setenv("CUTLASS_AOT_TRUST_ANY_OWNER", "1")
    assert len(Cache(cache_copy).entries) == TINY_VARIANTS


@pytest.fixture
def outside_so(built_cache, tmp_path):
    """A real, valid artifact that lives outside the cache (the index must not reach it)."""
    path = tmp_path / "outside" / "kernel.so"
    path.parent.mkdir()
    shutil.copyfile(artifact(built_cache.path, built_cache.keys[0]), path)
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "inner-dotdot", "symlink", "backslash"])
def test_entry_path_escaping_the_cache_is_refused_before_dlopen(cache_copy, built_cache, outside_so, how,
                                                              load_spy):
    key = built_cache.keys[0]
    if how == "symlink":
        link = artifact(cache_copy, key)
        link.unlink()
        link.symlink_to(outside_so)
    else:
        rel = {
            "dotdot": os.path.relpath(outside_so, cache_copy),
            "absolute": str(outside_so),
            "inner-dotdot": f"entries/{key}/../../../outside/kernel.so",
            "backslash": "entries\\..\\..\\outside\\kernel.so",
        }[how]
        # sha256 and size still match: only the path is hostile. Every
        # artifact lives at entries/<key>/kernel.so, so the index itself is
        # refused as it is read (like any malformed record), not the entry
        edit_index(cache_copy, lambda d: d["entries"][key].update(path=rel))
        with pytest.raises(IntegrityError) as info:
            Cache(cache_copy)
        assert "is not entries/<key>/kernel.so" in str(info.value)
        assert load_spy.calls == [] and str(outside_so) not in mapped_files()
        return
    cache = Cache(cache_copy)
    with pytest.raises(IntegrityError) as info:
        cache.function(key)
    assert "cache" in str(info.value)
    assert load_spy.calls == [] and str(outside_so) not in mapped_files()
    cache.function(built_cache.keys[1])
    assert len(load_spy.calls) == 1  # control: the spy sees real loads


def test_runtime_path_escaping_the_cache_is_refused(cache_copy, built_cache, tmp_path, monkeypatch):
    from cutlass_aot.run import load  # noqa: PLC0415 - reaching the process-wide runtime state

    monkeypatch.setattr(load, "_RUNTIME_LOADED", {})  # as if no runtime were loaded yet
    sha = next(iter(load_index_json(cache_copy)["runtimes"]))
    edit_index(cache_copy, lambda d: d["runtimes"][sha].update(path="../../etc/libevil.so"))
    with pytest.raises(IntegrityError, match="a bundled runtime lives at runtime/<its sha256>/"):
        Cache(cache_copy)  # refused as the index is read, before any runtime is looked at


@pytest.mark.parametrize("damage", ["flip", "truncate", "append", "empty"])
def test_tampered_artifact_is_refused_before_dlopen(cache_copy, built_cache, damage, load_spy):
    key = built_cache.keys[1]
    lib = artifact(cache_copy, key)
    if damage == "flip":
        flip_byte(lib, 100)
    elif damage == "truncate":
        truncate(lib)
    elif damage == "append":
        with open(lib, "ab") as f:
            f.write(b"\0")
    else:
        truncate(lib, 0)
    cache = Cache(cache_copy)
    with pytest.raises(IntegrityError, match="does not match its index record") as info:
        cache.function(key)
    assert info.value.key == key and "cutlass-aot verify" in str(info.value)
    assert load_spy.calls == [] and str(lib.resolve()) not in mapped_files()
    ok = next(k for k in built_cache.keys if k != key)
    assert cache.function(ok) is not None  # the rest of the cache still serves
    assert len(load_spy.calls) == 1


def test_missing_artifact_is_an_integrity_error(cache_copy, built_cache):
    key = built_cache.keys[2]
    artifact(cache_copy, key).unlink()
    with pytest.raises(IntegrityError, match="missing"):
        Cache(cache_copy).function(key)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign", "newer-layout", "bad-key"])
def test_damaged_index_is_refused_at_open(cache_copy, damage):
    path = cache_copy / "index.json"
    if damage == "truncate":
        truncate(path)
        expected = IntegrityError
    elif damage == "garbage":
        path.write_bytes(b"\x00\xffnot json")
        expected = IntegrityError
    elif damage == "foreign":
        path.write_text("[1, 2, 3]")
        expected = CacheError
    elif damage == "newer-layout":
        edit_index(cache_copy, lambda d: d.update(layout=LAYOUT_VERSION + 1))
        expected = CacheError
    else:
        edit_index(cache_copy, lambda d: d["entries"].update({"../x": {}}))
        expected = IntegrityError
    with pytest.raises(expected):
        Cache(cache_copy)


_LOOSE = {  # index values that once passed validation and crashed a reader or writer later
    "generation-null": lambda d, k: d.update(generation=None),
    "generation-str": lambda d, k: d.update(generation="7"),
    "layout-float": lambda d, k: d.update(layout=float(LAYOUT_VERSION)),
    "layout-bool": lambda d, k: d.update(layout=True),
    "runtime-no-size": lambda d, k: [r.pop("size") for r in d["runtimes"].values()],
    "runtime-size-str": lambda d, k: [r.update(size="12") for r in d["runtimes"].values()],
    "table-gpu-empty": lambda d, k: d.update(tables={"x": {"path": f"tables/{'a' * 64}.json",
                                                             "sha256": "a" * 64, "size": 3, "gpu": {}}}),
    "table-rows-str": lambda d, k: d.update(tables={"x": {
        "path": f"tables/{'a' * 64}.json", "sha256": "a" * 64, "size": 3, "rows": "1",
        "gpu": {"name": "H200", "sm_count": 132, "capability": "9.0"}}}),
    "built-at-naive": lambda d, k: d["entries"][k].update(built_at="2020-01-01T00:00:00"),
    "built-at-junk": lambda d, k: d["entries"][k].update(built_at="yesterday"),
    "size-negative": lambda d, k: d["entries"][k].update(size=-1),
}


@pytest.mark.parametrize("loose", sorted(_LOOSE))
def test_loosely_typed_index_values_are_refused_as_the_index_is_read(cache_copy, built_cache, loose):
    """Each of these passed validation once and then crashed `info`, `ls`, `gc`
    or an index writer with a traceback; now the read refuses them, naming the field."""
    edit_index(cache_copy, lambda d: _LOOSE[loose](d, built_cache.keys[0]))
    with pytest.raises((IntegrityError, CacheError)):
        Cache(cache_copy)
    res = run_cli("info", "--cache-dir", cache_copy)
    assert res.returncode in (1, 2) and "Traceback" not in res.stderr, res.stderr


def test_an_index_that_is_not_a_readable_file_is_a_clear_error(cache_copy):
    """Nested past the JSON parser's recursion limit, or a directory: a
    CutlassAotError naming the file, never RecursionError or IsADirectoryError."""
    path = cache_copy / "index.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(IntegrityError, match="not valid JSON"):
        Cache(cache_copy)
    path.unlink()
    path.mkdir()
    with pytest.raises(CacheError, match="cannot read the cache index"):
        Cache(cache_copy)
    for cmd in ("info", "ls", "verify"):
        res = run_cli(cmd, "--cache-dir", cache_copy)
        assert res.returncode in (1, 2) and "Traceback" not in res.stderr, (cmd, res.stderr)
    path.rmdir()


@pytest.mark.parametrize("mutate", ["signature-no-op", "signature-fields-list", "toolchain-str",
                                    "tvm-ffi-int", "signature-field-float"])
def test_malformed_nested_record_is_an_integrity_error(cache_copy, built_cache, mutate):
    key = built_cache.keys[0]

    def edit(d):
        rec = d["entries"][key]
        if mutate == "signature-no-op":
            del rec["signature"]["op"]
        elif mutate == "signature-fields-list":
            rec["signature"]["fields"] = [1]
        elif mutate == "toolchain-str":
            del rec["tvm_ffi"]
        elif mutate == "tvm-ffi-int":
            rec["tvm_ffi"] = 5
        else:
            rec["signature"]["fields"]["a"] = 1.5

    edit_index(cache_copy, edit)
    try:
        Cache(cache_copy)
    except cutlass_aot.CutlassAotError:
        pass
    except Exception as exc:  # noqa: BLE001 - the point: only cutlass-aot errors
        raise AssertionError(f"{type(exc).__name__}: {exc} escaped Cache()") from exc


# -------------------------------------------------------------- (e) read-only
def test_read_only_cache_loads_and_nothing_is_written(cache_copy, built_cache):
    make_tree_readonly(cache_copy)
    try:
        before = tree_snapshot(cache_copy)
        cache = Cache(cache_copy)
        assert set(cache.entries) == set(built_cache.keys)
        for key in cache.entries:
            assert cache.function(key) is not None
        with pytest.raises(ArgumentError):
            cache.gemm(torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))
        cache.not_found(cache.signatures()[0])
        assert tree_snapshot(cache_copy) == before
    finally:
        make_tree_writable(cache_copy)


# ------------------------------------------------------------------ (f) skew
def test_tvm_ffi_and_abi_skew_make_entries_unusable(cache_copy, built_cache):
    k_tvm, k_abi, k_ok = built_cache.keys

    def edit(d):
        d["entries"][k_tvm]["tvm_ffi"] = "0.0.1"
        d["entries"][k_abi]["abi"] = "x"

    edit_index(cache_copy, edit)
    cache = Cache(cache_copy)
    assert set(cache.unusable) == {k_tvm, k_abi}
    assert "tvm-ffi" in cache.unusable[k_tvm] and "0.0.1" in cache.unusable[k_tvm]
    assert "rebuild" in cache.unusable[k_tvm]
    assert "ABI 'x'" in cache.unusable[k_abi]
    assert set(cache.entries) == {k_ok}
    assert all(e.key == k_ok for es in cache.by_signature.values() for e in es)
    with pytest.raises(KernelNotFoundError, match="tvm-ffi"):
        cache.function(k_tvm)
    with pytest.raises(KernelNotFoundError, match="ABI"):
        cache.function(k_abi)
    assert cache.function(k_ok) is not None
    msg = str(cache.not_found(cache.signatures()[0]))
    assert "entries skipped in this process:" in msg and k_tvm[:12] in msg


def test_split_k_v1_entries_are_refused(cache_copy, built_cache):
    """A v1 split-K artifact splits every tile: the v2 run side sizes the
    workspace for the last wave only, so calling it would write past it."""
    key = built_cache.keys[0]
    edit_index(cache_copy, lambda d: d["entries"][key].update(abi="cutlass-aot-gemm-splitk-v1"))
    cache = Cache(cache_copy)
    assert "ABI 'cutlass-aot-gemm-splitk-v1'" in cache.unusable[key]
    with pytest.raises(KernelNotFoundError, match="ABI"):
        cache.function(key)


def test_user_abi_and_same_minor_tvm_ffi_stay_usable(cache_copy, built_cache):
    k1, k2, _ = built_cache.keys

    def edit(d):
        d["entries"][k1]["abi"] = "user:toy-v1"
        rec = d["entries"][k2]
        rec["tvm_ffi"] = ".".join(rec["tvm_ffi"].split(".")[:2]) + ".999"

    edit_index(cache_copy, edit)
    cache = Cache(cache_copy)
    assert cache.unusable == {} and len(cache.entries) == TINY_VARIANTS


def test_other_runtime_library_makes_entries_unusable(cache_copy, built_cache):
    key = built_cache.keys[0]
    edit_index(cache_copy, lambda d: d["entries"][key].update(runtime="e" * 64))
    cache = Cache(cache_copy)
    assert "libcute_dsl_runtime" in cache.unusable[key]
    assert len(cache.entries) == TINY_VARIANTS - 1


# -------------------------------------------------------- (g) container flow
LOAD_ALL_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import cutlass_aot
root = Path(sys.argv[1])
try:  # prove the cache really is read-only for this process
    (root / "probe").write_text("x")
    writable = True
except PermissionError:
    writable = False
cache = cutlass_aot.open_cache(root)
loaded = sorted(k for k in cache.entries if cache.function(k) is not None)
print(json.dumps({"loaded": loaded, "unusable": cache.unusable, "writable": writable}))
"""

NO_CAPS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_container_flow_frozen_cache_lists_and_loads_in_another_process(built_cache, tmp_path):
    """Build into a dir, make it read-only, list and load it from unprivileged processes.

    The build is the session's (the real builder), copied with its modes.
    """
    image = copy_cache(built_cache.path, tmp_path / "image" / "cache")
    make_tree_readonly(image)
    try:
        before = tree_snapshot(image)
        # Without capabilities even root cannot write past the mode bits.
        ls = run_cli_json_prefixed(NO_CAPS, "ls", "--cache-dir", image)
        assert sorted(row["key"] for row in ls["entries"]) == sorted(built_cache.keys)
        proc = run_python(LOAD_ALL_SCRIPT, image, prefix=NO_CAPS)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["writable"] is False
        assert out["loaded"] == sorted(built_cache.keys) and out["unusable"] == {}
        assert tree_snapshot(image) == before
    finally:
        make_tree_writable(image)


def run_cli_json_prefixed(prefix, *args):
    proc = subprocess.run([*prefix, sys.executable, "-m", "cutlass_aot.cli", *map(str, args), "--json"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# The service runs as its own user; the image was built by root. The script
# imports everything it needs while still root (the interpreter lives under
# /root here), then drops to uid/gid 65534 before touching the cache.
SERVICE_USER_SCRIPT = r"""
import ctypes, hashlib, importlib.metadata, importlib.util, json, os, sys
import torch, tvm_ffi
import cutlass_aot, cutlass_aot.run.load, cutlass_aot.run.dispatch
os.setgroups([]); os.setgid(65534); os.setuid(65534)
cache = cutlass_aot.Cache(sys.argv[1])
result = {}
for key in sorted(cache.entries):
    try:
        cache.function(key)
        result[key] = "ok"
    except Exception as exc:
        result[key] = f"{type(exc).__name__}: {exc}"
print(json.dumps(result))
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to a service user")


@pytest.fixture
def public_dir():
    """A directory any user can traverse (pytest's own tmp root is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="cutlass-aot-image-"))
    os.chmod(path, 0o755)
    yield path
    make_tree_writable(path)
    shutil.rmtree(path, ignore_errors=True)


def _service_user_load(image) -> dict:
    proc = run_python(SERVICE_USER_SCRIPT, image)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_root
def test_service_user_harness_loads_a_world_readable_cache(built_cache, public_dir):
    """Control for the next test: with every dir made a+rX the harness itself works."""
    image = copy_cache(built_cache.path, public_dir / "cache")
    for dirpath, dirs, _files in os.walk(image):
        for name in dirs:
            os.chmod(os.path.join(dirpath, name), 0o755)
    make_tree_readonly(image)
    try:
        assert _service_user_load(image) == {k: "ok" for k in built_cache.keys}
    finally:
        make_tree_writable(image)


@needs_root
def test_service_user_loads_a_cache_built_by_root(built_cache, public_dir):
    """Entries and the runtime are published a+rX (they start as 0700 mkdtemp dirs)."""
    image = copy_cache(built_cache.path, public_dir / "cache")  # copytree keeps the modes
    make_tree_readonly(image)
    try:
        assert _service_user_load(image) == {k: "ok" for k in built_cache.keys}
    finally:
        make_tree_writable(image)


@pytest.mark.gpu
def test_gpu_marker_runs_only_where_cuda_is():
    """The conftest skips gpu-marked items at collection when torch sees no CUDA device."""
    assert torch.cuda.is_available()


def test_overlapping_outputs_are_refused():
    """Outputs whose elements share memory are refused at resolution (the
    artifact's divisibility checks accept a stride of 0)."""
    for ok in (torch.empty(5, 8), torch.empty(8, 5).t(), torch.empty(5, 16)[:, :8],
               torch.empty(3, 5, 8), torch.empty(1, 8).expand(1, 8), torch.empty(0, 8)):
        check_no_internal_overlap(tuple(ok.shape), ok.stride())
    for bad in (torch.empty(1, 8).expand(5, 8), torch.empty(64).as_strided((5, 8), (4, 1)),
                torch.empty(5, 8).expand(3, 5, 8)):
        with pytest.raises(ArgumentError, match="share memory"):
            check_no_internal_overlap(tuple(bad.shape), bad.stride())


def _view_of(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size())


def _bytes_of(t: torch.Tensor) -> set:
    """Every byte a view covers, by walking its elements (the brute-force truth)."""
    import itertools  # noqa: PLC0415

    base, item = t.data_ptr(), t.element_size()
    out = set()
    for idx in itertools.product(*(range(n) for n in t.shape)):
        off = sum(i * s for i, s in zip(idx, t.stride()))
        out.update(range(base + off * item, base + (off + 1) * item))
    return out


def _random_view(rng, storage: torch.Tensor) -> torch.Tensor:
    """A view into ``storage``: rank 1-4, sizes 0..7, a padded layout in a
    random dim order (sometimes a broadcast dim, often an arbitrary stride,
    so rows overlap, interleave or come in blocks), at a random offset:
    what slicing, transposing and padding make, and what as_strided can."""
    rank = rng.choice([1, 2, 2, 3, 3, 4])
    shape = [rng.choice([0, 1, 2, 3, 5, 6, 7]) for _ in range(rank)]
    order = list(range(rank))
    rng.shuffle(order)
    strides, step = [0] * rank, 1
    for d in order:
        strides[d] = 0 if rng.random() < 0.05 else step
        step = rng.randint(1, 40) if rng.random() < 0.3 else step * (max(shape[d], 1) + rng.choice([0, 0, 1, 3]))
    last = sum((n - 1) * s for n, s in zip(shape, strides) if n)
    if last >= storage.numel():
        return _random_view(rng, storage)
    return storage.as_strided(shape, strides, rng.randint(0, storage.numel() - last - 1))


def test_floor_sum_counts_lattice_points():
    """select._floor_sum against the sum it stands for, negative offsets included."""
    import random  # noqa: PLC0415

    rng = random.Random(5)
    for _ in range(3000):
        n, m, a, b = rng.randint(0, 40), rng.randint(1, 60), rng.randint(0, 150), rng.randint(-400, 400)
        assert select._floor_sum(n, m, a, b) == sum((a * t + b) // m for t in range(n)), (n, m, a, b)


def test_views_overlap_is_exact():
    """select.views_overlap against the bytes each view covers, on seeded
    random views of one buffer (rows that overlap, interleave, or come in
    blocks; element sizes 1, 2 and 4 against each other): every answer is
    right, and it always answers. Then the layouts calls use, by name."""
    import random  # noqa: PLC0415

    rng = random.Random(20261204)
    storage = torch.empty(200, dtype=torch.bfloat16)
    as_item = {1: storage.view(torch.uint8), 2: storage, 4: storage.view(torch.float32)}
    answers = {True: 0, False: 0, None: 0}
    for _ in range(6000):
        x, y = (_random_view(rng, as_item[rng.choice([1, 2, 2, 4])]) for _ in range(2))
        got = select.views_overlap(_view_of(x), _view_of(y))
        answers[got] += 1
        assert got is bool(_bytes_of(x) & _bytes_of(y)), (_view_of(x), _view_of(y))
    assert answers[True] > 500 and answers[False] > 2000 and answers[None] == 0, answers
    buf = torch.empty(64, 96, dtype=torch.bfloat16)
    flat = torch.empty(1 << 17, dtype=torch.bfloat16)
    pairs = {  # (x, y): shares a byte
        (buf[:, :32], buf[:, 32:]): False,     # column blocks of one buffer (a fused QKV)
        (buf[:, :33], buf[:, 32:]): True,
        (buf[:32], buf[32:]): False,           # row blocks
        (buf[::2], buf[1::2]): False,          # alternate rows
        (buf[:, :48].t(), buf[:, 40:]): True,  # a transposed view
        (buf.view(2, 32, 96)[:, :, :8], buf[:, 8:16]): False,  # batched against a slice
        (buf, torch.empty(64, 96, dtype=torch.bfloat16)): False,
        # two row pitches over one buffer: 40-element rows every 48 against
        # 8-element rows in their gaps (every 96), or with the middle row of
        # three (every 72) in a row: only the floor sum sees that one
        (flat.as_strided((30, 40), (48, 1)), flat.as_strided((4, 8), (96, 1), 40)): False,
        (flat.as_strided((30, 40), (48, 1)), flat.as_strided((3, 8), (72, 1), 40)): True,
        # batches with a gap (padded batch stride): heads of one buffer
        (flat.as_strided((4, 16, 32), (1024, 64, 1)), flat.as_strided((4, 16, 32), (1024, 64, 1), 32)): False,
        (flat.as_strided((4, 16, 32), (1024, 64, 1)), flat.as_strided((4, 16, 32), (1024, 64, 1), 31)): True,
        (flat.as_strided((4, 16, 32), (1024, 64, 1)), flat.as_strided((16, 32), (64, 1), 1056)): False,
        (flat.as_strided((4, 16, 32), (1024, 64, 1)), flat.as_strided((2, 32), (1024, 1), 992)): False,
        (flat.as_strided((4, 16, 32), (1024, 64, 1)), flat.as_strided((2, 33), (1024, 1), 992)): True,
    }
    for (x, y), want in pairs.items():
        assert select.views_overlap(_view_of(x), _view_of(y)) is want, (_view_of(x), _view_of(y))
        assert want is bool(_bytes_of(x) & _bytes_of(y))
    # More block pairs than its budget, byte ranges interleaved: it cannot tell.
    x = flat.as_strided((80, 80, 2), (7, 1000, 2))
    assert select.views_overlap(_view_of(x), _view_of(flat.as_strided((80, 80, 2), (7, 1000, 2), 1))) is None


def test_out_sharing_memory_with_an_operand_is_refused():
    """check_no_alias: out may be c itself (an in-place residual), never
    share a byte with a, b, bias, or c as another view; disjoint blocks of
    one buffer pass."""
    buf = torch.empty(64, 96, dtype=torch.bfloat16)
    a, b, out = buf[:, :32], torch.empty(32, 16, dtype=torch.bfloat16), buf[:, 32:48]
    select.check_no_alias(_view_of(out), {"a": _view_of(a), "b": _view_of(b), "c": None,
                                          "bias": None})
    select.check_no_alias(_view_of(out), {"a": _view_of(a), "c": _view_of(buf[:, 32:48])})
    for name, other in (("a", buf[:, 40:72]), ("b", buf[:32, 40:56]), ("bias", buf[3, 32:48]),
                        ("c", buf[:, 33:49]), ("c", buf[:, 32:48].t().t()[1:])):
        with pytest.raises(ArgumentError, match=f"shares memory with {name}") as info:
            select.check_no_alias(_view_of(out), {name: _view_of(other)})
        assert info.value.tensor == name and info.value.reason == "alias"


def test_the_per_call_filter_never_misses_an_overlap():
    """dispatch's per-call filter (pointer compares, strides read only where
    byte ranges meet) flags every pair the exact check calls overlapping."""
    import random  # noqa: PLC0415

    from cutlass_aot.run import dispatch  # noqa: PLC0415

    rng = random.Random(4)
    storage = torch.empty(4096, dtype=torch.bfloat16)
    flagged = 0
    for _ in range(3000):
        m, n, k = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
        pick = [storage.as_strided(shape, stride, rng.randint(0, 3000)) for shape, stride in (
            ((m, k), rng.choice([(k, 1), (1, m), (k + 3, 1)])),
            ((k, n), rng.choice([(n, 1), (1, k), (1, k + 2)])),
            ((m, n), rng.choice([(n, 1), (1, m), (n + 5, 1)])),
            ((m, n), rng.choice([(n, 1), (n + 5, 1)])),
            ((n,), (1,)))]
        a, b, out, c, bias = pick
        spans = dispatch._alias_spans(a, b, out, c, bias)
        exact = any(select.views_overlap(_view_of(out), _view_of(t)) for t in (a, b, c, bias))
        if exact:
            flagged += 1
            assert dispatch._may_alias(spans, a, b, out, c, bias)
    assert flagged > 100
    # Batched, with batch strides that leave gaps (blocks of rows, which the
    # exact test walks since r46).
    flagged = 0
    for _ in range(1500):
        L, m, n, k = rng.randint(2, 3), rng.randint(1, 7), rng.randint(1, 7), rng.randint(1, 7)
        gap = rng.choice([0, 5, 40])
        pick = [storage.as_strided(shape, stride, rng.randint(0, 3000)) for shape, stride in (
            ((L, m, k), rng.choice([(m * k + gap, k, 1), (m * (k + 3) + gap, k + 3, 1), (m * k + gap, 1, m)])),
            ((L, k, n), rng.choice([(k * n + gap, n, 1), (k * n, 1, k)])),
            ((L, m, n), rng.choice([(m * n + gap, n, 1), (m * (n + 5) + gap, n + 5, 1)])),
            ((L, m, n), rng.choice([(m * n, n, 1), (m * (n + 5) + gap, n + 5, 1)])),
            ((n,), (1,)))]
        a, b, out, c, bias = pick
        spans = dispatch._alias_spans(a, b, out, c, bias)
        if any(select.views_overlap(_view_of(out), _view_of(t)) for t in (a, b, c, bias)):
            flagged += 1
            assert dispatch._may_alias(spans, a, b, out, c, bias)
    assert flagged > 100
    # K = 0: a and b are empty and share nothing; an empty out skips the filter.
    out = storage[:64].view(8, 8)
    a, b = storage[:0].view(8, 0), storage[:0].view(0, 8)
    assert not dispatch._may_alias(dispatch._alias_spans(a, b, out, None, None), a, b, out, None, None)
    assert dispatch._alias_spans(a.t(), storage[:0].view(0, 0), storage[:0].view(0, 0), None, None)[0] == 0


def test_launch_faults_are_told_apart_from_argument_refusals(built_cache):
    """A RuntimeError from a launch whose arguments pass every check is a
    LaunchError carrying the CUDA message; a ValueError/TypeError from the
    artifact's checks is an ArgumentError; a misaligned tensor is named.
    (Before this round every RuntimeError became ArgumentError(reason="artifact-check").)"""
    from cutlass_aot import LaunchError  # noqa: PLC0415 - local to this test
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    runner = GemmRunner(Cache(built_cache.path))
    a = torch.randn(64, 32, dtype=torch.bfloat16)
    b = torch.randn(48, 32, dtype=torch.bfloat16).t()
    out = torch.empty(64, 48, dtype=torch.bfloat16)
    fault = runner._diagnose(a, b, out, None, None, RuntimeError("CUDA error: an illegal memory access"))
    assert isinstance(fault, LaunchError) and not isinstance(fault, ArgumentError)
    assert "illegal memory access" in fault.message and fault.cuda_message.startswith("CUDA error")
    refused = runner._diagnose(a, b, out, None, None, ValueError("Mismatched dtype"))
    assert isinstance(refused, ArgumentError) and refused.reason == "artifact-check"
    odd = torch.randn(64 * 32 + 1, dtype=torch.bfloat16)[1:].view(64, 32)
    misaligned = runner._diagnose(odd, b, out, None, None, RuntimeError("x"))
    assert isinstance(misaligned, ArgumentError) and misaligned.reason == "alignment"


def test_misaligned_call_is_served_staged_by_the_aligned_variants(built_cache):
    """The tiny cache holds 16-byte aligned sm_90a variants only. A call whose
    A starts 2 bytes off is served by them staged (copied into aligned
    scratch) under either on_miss policy. (Before this round it was an
    ArgumentError, or a torch fallback under on_miss="torch".) A signature
    the cache lacks is a miss that names the 16-byte signature to build,
    which would serve such calls too."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    odd = torch.randn(64 * 32 + 1, dtype=torch.bfloat16)[1:].view(64, 32)
    b = torch.randn(48, 32, dtype=torch.bfloat16).t()
    out = torch.empty(64, 48, dtype=torch.bfloat16)
    sig = Signature.make("gemm", "sm_90a", {
        "a": "bf16", "b": "bf16", "d": "bf16", "c": None, "a_major": "k", "b_major": "k",
        "d_major": "n", "rank": 2, "align": 16})
    for policy in ("raise", "torch"):
        runner = GemmRunner(Cache(built_cache.path, on_miss=policy))
        assert sig in runner.cache.by_signature
        assert runner._serving_signature(sig, "sm_90a", odd, b, out, None) == (sig, 2)
        aligned = torch.randn(64, 32, dtype=torch.bfloat16)
        assert runner._serving_signature(sig, "sm_90a", aligned, b, out, None) == (sig, 16)
    absent = Signature.make("gemm", "sm_90a", dict(sig.fields, a="f16", b="f16", d="f16"))
    with pytest.raises(KernelNotFoundError) as miss:
        runner._serving_signature(absent, "sm_90a", odd.half(), b.half(), out.half(), None)
    assert miss.value.miss_signature == absent


def test_unaligned_route_knob_and_setter_refuse_junk(built_cache, monkeypatch):
    """CUTLASS_AOT_UNALIGNED and GemmRunner.set_unaligned take auto, staged or
    native; anything else is a UsageError naming the choices."""
    from cutlass_aot.errors import UsageError  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    monkeypatch.setenv("CUTLASS_AOT_UNALIGNED", "staged")
    runner = GemmRunner(Cache(built_cache.path))
    assert runner.unaligned == "staged"
    runner.set_unaligned("native")
    assert runner.unaligned == "native"
    with pytest.raises(UsageError, match="use one of auto, staged, native"):
        runner.set_unaligned("pad")
    monkeypatch.setenv("CUTLASS_AOT_UNALIGNED", "sometimes")
    with pytest.raises(UsageError, match="CUTLASS_AOT_UNALIGNED='sometimes'"):
        GemmRunner(Cache(built_cache.path))


def test_pitched_scratch_keeps_layout_and_is_16_byte_aligned():
    """pitch.pitched_like: same shape, dtype and majorness, every non-unit stride a
    16-byte multiple (what the staged route hands the TMA variants)."""
    from cutlass_aot.archs import tensor_alignment  # noqa: PLC0415
    from cutlass_aot.run.pitch import pitched_like as _pitched_like  # noqa: PLC0415 - imports torch
    from cutlass_aot.run.select import major  # noqa: PLC0415

    base = torch.randn(4 * 33 * 13 + 1, dtype=torch.bfloat16)
    cases = [base[1:1 + 33 * 13].view(33, 13), torch.randn(13, 33, dtype=torch.float16).t(),
             base[1:].view(4, 33, 13), torch.randn(4, 13, 33, dtype=torch.float32).transpose(1, 2),
             torch.randn(1, 7, dtype=torch.bfloat16), torch.randn(7, 1, dtype=torch.bfloat16)]
    for t in cases:
        p = _pitched_like(t)
        assert p.shape == t.shape and p.dtype == t.dtype
        assert major(p.stride(), p.shape, "n", "m") == major(t.stride(), t.shape, "n", "m")
        assert tensor_alignment(p.data_ptr(), p.stride(), p.element_size()) == 16
        assert torch.equal(p.copy_(t), t)


def test_staged_routes_per_call_alignment_check_agrees_with_tensor_alignment():
    """pitch.aligned16 (unrolled, per call) == archs.tensor_alignment(...) >= 16
    over random strided views: offsets, broadcast (0) and size-1 strides."""
    import random  # noqa: PLC0415

    from cutlass_aot.archs import tensor_alignment  # noqa: PLC0415
    from cutlass_aot.run.pitch import aligned16 as _aligned16  # noqa: PLC0415 - imports torch

    rng = random.Random(7)
    base = torch.empty(1 << 16, dtype=torch.bfloat16)
    checked = 0
    for _ in range(2000):
        rank = rng.choice((2, 3))
        shape = [rng.randint(1, 9) for _ in range(rank)]
        strides = [rng.choice((0, 1, 2, 3, 8, 16, 24, 80, 81)) for _ in range(rank)]
        strides[rng.choice((-1, -2))] = 1
        view = base.as_strided(shape, strides, rng.choice((0, 1, 4, 8)))
        assert _aligned16(view) == (tensor_alignment(view.data_ptr(), view.stride(), 2) >= 16), \
            (shape, strides, view.storage_offset())
        checked += 1
    assert checked == 2000


def test_odd_edge_reads_the_contiguous_extent_of_either_majorness():
    """pitch.odd_edge: whether a 16-byte store of out's last chunk would run past
    its contiguous extent (N row-major, M column-major, any rank), in bytes."""
    from cutlass_aot.run.pitch import odd_edge  # noqa: PLC0415 - imports torch

    def padded(rows, cols, dtype, col_major=False, batch=0):
        inner, outer = (rows, cols) if col_major else (cols, rows)
        pitch = -(-inner // 64) * 64  # 128-byte pitch for bf16: pointer and strides aligned
        base = torch.zeros((batch or 1) * outer * pitch, dtype=dtype)
        st = (1, pitch) if col_major else (pitch, 1)
        if batch:
            return base.as_strided((batch, rows, cols), (outer * pitch, *st))
        return base.as_strided((rows, cols), st)

    bf, f32 = torch.bfloat16, torch.float32
    assert odd_edge(padded(5, 263, bf))                      # 526 bytes
    assert not odd_edge(padded(5, 264, bf))                  # 528: a 16-byte multiple
    assert odd_edge(padded(5, 6, f32))                       # 24 bytes
    assert not odd_edge(padded(5, 8, f32))
    assert odd_edge(padded(263, 8, bf, col_major=True))      # column-major: M is the edge
    assert not odd_edge(padded(264, 7, bf, col_major=True))  # N does not matter then
    assert odd_edge(padded(3, 100, bf, batch=2)) and not odd_edge(padded(3, 96, bf, batch=2))
    assert not odd_edge(torch.zeros(7, 8, dtype=bf))
    assert odd_edge(torch.zeros(7, 9, dtype=bf))             # contiguous: misaligned rows too


def test_exact_store_families_are_the_manifests_own_names():
    """The run side's list of families that never write past out's edge names
    families as the shipped manifests spell them (a rename must not quietly
    send their calls through scratch, nor the TMA family's around it)."""
    import yaml  # noqa: PLC0415

    from cutlass_aot.run.pitch import EXACT_STORE_FAMILIES, stores_whole_chunks  # noqa: PLC0415

    used = set()
    for path in sorted(Path(cutlass_aot.__file__).parents[1].joinpath("configs").glob("*.yaml")):
        used |= {k["family"] for k in yaml.safe_load(path.read_text())["kernels"]}
    assert EXACT_STORE_FAMILIES <= used, EXACT_STORE_FAMILIES - used
    assert stores_whole_chunks("sm90_gemm") and stores_whole_chunks("pkg.mod:UserFamily")
    assert not any(stores_whole_chunks(f) for f in EXACT_STORE_FAMILIES)


def test_an_odd_edge_out_is_written_through_scratch_by_a_tma_variant(built_cache):
    """dispatch._memo_entry with odd_edge: the sm90_gemm artifact (a TMA store)
    is wrapped in the staged launcher that writes scratch and copies the view
    back; without odd_edge it launches bare. Real artifacts from the session
    cache, loaded through tvm-ffi."""
    from cutlass_aot.layout import GEMM_ABIS, GEMM_SPLITK_ABI  # noqa: PLC0415
    from cutlass_aot.run import dispatch, select  # noqa: PLC0415

    cache = Cache(built_cache.path)
    key = next(k for k, e in cache.entries.items()
               if e.record["family"] == "sm90_gemm" and dict(e.signature.fields).get("c") is None
               and e.record["abi"] in GEMM_ABIS and e.record["abi"] != GEMM_SPLITK_ABI
               and dict(e.signature.fields).get("bias") is None)
    choice = select.Choice(select.candidate_from_variant(key, cache.entries[key].variant), 1, "model")
    fn, sms, launch = dispatch._memo_entry(cache, choice, 132, 263, 263, 1, False, grid_sms=132)
    assert launch is None and sms == 132
    fn, sms, launch = dispatch._memo_entry(cache, choice, 132, 263, 263, 1, False, grid_sms=132,
                                           odd_edge=True)
    assert getattr(launch, "staged", False), "a TMA store would write past out's edge"
    assert dispatch._fast_registration((fn, sms, launch)) is None  # never the C++ entry's


def test_autotune_setter_refuses_junk_and_forgets_choices(built_cache, monkeypatch):
    """GemmRunner.set_autotune takes 0 (off) or a count >= 2; junk is a
    UsageError. The knob sets the runner's starting value."""
    from cutlass_aot.errors import UsageError  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    monkeypatch.setenv("CUTLASS_AOT_AUTOTUNE", "4")
    runner = GemmRunner(Cache(built_cache.path))
    assert runner.autotune == 4
    runner._memo[("probe",)] = ("x",)
    runner.set_autotune(0)
    assert runner.autotune == 0 and not runner._memo
    for junk in (1, -3, "6", True, 2.5):
        with pytest.raises(UsageError, match="autotune count"):
            runner.set_autotune(junk)
    monkeypatch.setenv("CUTLASS_AOT_AUTOTUNE", "often")
    with pytest.raises(UsageError, match="CUTLASS_AOT_AUTOTUNE='often'"):
        GemmRunner(Cache(built_cache.path))


def test_autotune_keeps_the_first_choice_when_a_timing_run_fails(built_cache):
    """Timing is an optimization: when an option's artifact refuses the
    operands (here real artifacts, given CPU tensors), _autotuned returns the
    table's or model's choice and its launcher, and the call itself reports."""
    import dataclasses  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch

    runner = GemmRunner(Cache(built_cache.path))
    runner.set_autotune(4)
    sig = next(s for s in runner.cache.by_signature
               if dict(s.fields).get("c") is None and dict(s.fields).get("b_major") == "k")
    (cand,) = runner._candidates_for(sig)
    twin = dataclasses.replace(cand, tile_n=64)  # a second option, on the same artifact
    choice = select.Choice(cand, 1, "model")
    a = torch.randn(256, 512, dtype=torch.bfloat16)
    b = torch.randn(384, 512, dtype=torch.bfloat16).t()
    out = torch.empty(256, 384, dtype=torch.bfloat16)
    got, hit = runner._autotuned(choice, [cand, twin], (256, 384, 512, 1), 132, a, b, out, None,
                                 None)
    assert got is choice
    assert hit[0] is runner.cache.function(cand.key) and hit[2] is None


def test_resident_grid_uses_the_drivers_answer_clamped_else_the_fitted_counts(monkeypatch):
    """run/occupancy.py: a cluster of n CTAs is handed the resident clusters
    times n (the driver's answer, at most SMs // n), or select.cluster_slots'
    fitted count where the driver gave none; a single CTA keeps every SM."""
    monkeypatch.setitem(occupancy._ANSWERS, 7, {1: 132, 2: 66, 3: 40, 4: 30})
    monkeypatch.setitem(occupancy._ANSWERS, 8, None)
    monkeypatch.setitem(occupancy._ANSWERS, 9, {1: 132, 2: 99, 3: 44, 4: 40})
    assert [occupancy.grid_sms(7, s, 132) for s in (1, 2, 3, 4)] == [132, 132, 120, 120]
    assert occupancy.grid_sms(8, 4, 132) == 4 * select.cluster_slots(4, 132) == 120
    assert occupancy.grid_sms(8, 3, 132) == 3 * select.cluster_slots(3, 132)
    assert occupancy.grid_sms(8, 1, 132) == 132
    # an answer above what the SMs can hold is clamped to SMs // size
    assert [occupancy.grid_sms(9, s, 132) for s in (2, 4)] == [132, 132]


def test_split_tail_of_a_4_cta_cluster_counts_resident_waves():
    """The model's split-K tail of a 4x1 cluster is the last partial wave
    over the resident clusters (30 on 132 SMs), as the kernel now walks it:
    31 clusters of tiles are a whole wave and one over, not one wave of 33."""
    c = select.Candidate("k", 128, 128, 4, 1, split_k=True)
    assert select._split_tail(c, 4 * 31, 132) == 4 * splitk_tail_tiles(31, 30)
    assert select._split_tail(c, 4 * 31, 132) != 4 * splitk_tail_tiles(31, 33)


# ---------------------------------------------- r51 review: what DLPack drops
# A stand-in for a compiled artifact (a tvm-ffi function): it records the data
# pointers it was handed and writes alpha * a @ b through DLPack, as a kernel
# writes out's memory unseen by torch. Injected into a runner's memo (and the
# C++ entry's registrations), so a CPU test drives the memoized call path.
_RM, _RN, _RK = 64, 32, 48


def _stand_in_runner(built_cache, fast, log):
    import tvm_ffi  # noqa: PLC0415

    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    runner = GemmRunner(Cache(built_cache.path), fast=fast)
    # a call without out allocates it on a's device: here, the CPU (the entry
    # refuses that on its own; the launch below is what these tests drive)
    runner._new_out = lambda a, b: torch.empty(*a.shape[:-1], b.shape[-1], dtype=a.dtype)

    def artifact(a, b, d, alpha, sms):
        ptrs = (a.data_ptr(), b.data_ptr(), d.data_ptr())
        log.append(ptrs)
        if 0 not in ptrs:  # a GPU kernel would dereference null
            av, bv, dv = (torch.from_dlpack(t) for t in (a, b, d))
            dv.copy_((alpha * (av.float() @ bv.float())).to(dv.dtype))

    fn = tvm_ffi.convert(artifact)

    def memoize(a, b, out):
        key = (out.shape, out.stride(), out.dtype, a.stride(), b.stride(), a.shape[-1], None, None,
               None, a.dtype)
        runner._memo[key] = (fn, 132, None)
        if fast:
            runner._fast_regs[key] = (fn, 132, -1, 0)

    return runner.entry(), memoize


def _operands():
    bf = torch.bfloat16
    return (torch.randn(_RM, _RK, dtype=bf), torch.randn(_RK, _RN, dtype=bf),
            torch.zeros(_RM, _RN, dtype=bf))


@pytest.mark.parametrize("fast", [True, False])
def test_a_kernel_write_bumps_outs_version_so_backward_sees_it(built_cache, fast):
    """r51 review: the kernel writes out through DLPack, and out._version did
    not move: a tensor autograd had saved, overwritten by gemm under no_grad,
    gave backward the new values in silence (torch.mm(out=) makes backward
    raise). The entry bumps out's version as torch's out= functions do."""
    log = []
    gemm, memoize = _stand_in_runner(built_cache, fast, log)
    a, b, out = _operands()
    memoize(a, b, out)
    x = torch.randn(_RM, _RN, dtype=torch.bfloat16, requires_grad=True)
    y = (x * out).sum()  # autograd saves out for x's gradient
    before = out._version
    with torch.no_grad():
        gemm(a, b, out)
        gemm(a, b, out)  # the C++ entry serves the second call where it is built
    assert len(log) == 2 and out._version >= before + 2, (log, before, out._version)
    assert torch.equal(out, (a.float() @ b.float()).to(out.dtype))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    with torch.no_grad():
        fresh = gemm(a, b)  # a new out: nothing to bump, and served all the same
    assert torch.equal(fresh, out)


@pytest.mark.parametrize("fast", [True, False])
def test_beta_zero_with_a_c_that_is_no_tensor_keeps_the_guards(built_cache, fast):
    """r51 review: with grad mode on, c=0.0 (a number) made c.requires_grad
    raise AttributeError, which skipped the rest of the guards, and beta=0
    then dropped c: a neg view came back unnegated, and a bias requiring grad
    was written with no graph. beta=0 drops c before the guards now."""
    log = []
    gemm, memoize = _stand_in_runner(built_cache, fast, log)
    a, b, out = _operands()
    memoize(a, b, out)
    assert torch.is_grad_enabled()
    with pytest.raises(ArgumentError, match="a is a negative-bit view"):
        gemm(torch._neg_view(a), b, out, c=0.0, beta=0.0)
    bias = torch.zeros(_RN, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ArgumentError, match="no_grad") as info:
        gemm(a, b, out, bias=bias, c=0, beta=0)
    assert info.value.reason == "autograd" and not log
    with pytest.raises(ArgumentError, match="c: float"):  # read (beta 1): named as no tensor
        gemm(a, b, out, c=0.0)


@pytest.mark.parametrize("fast", [True, False])
def test_a_tensor_without_storage_is_refused_not_launched_at_address_0(built_cache, fast):
    """r51 review: a zero tensor, a wrapper subclass (as DTensor is) or a fake
    tensor crosses DLPack with a null data pointer, which the artifact's
    alignment checks pass: a memoized layout launched on address 0 (an
    illegal-address fault on a GPU, which ends the CUDA context). The C++
    entry misses on a null pointer, and the Python path refuses it; vmap's
    batched tensors, which have no pointer at all, raised a bare RuntimeError."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
    from torch.testing._internal.two_tensor import TwoTensor  # noqa: PLC0415

    log = []
    gemm, memoize = _stand_in_runner(built_cache, fast, log)
    a, b, out = _operands()
    memoize(a, b, out)
    gemm(a, b, out)
    assert len(log) == 1 and 0 not in log[0]
    fake = FakeTensorMode()
    zero = torch._efficientzerotensor
    for name, args in (("a", (zero((_RM, _RK), dtype=torch.bfloat16), b, out)),
                       ("out", (a, b, zero((_RM, _RN), dtype=torch.bfloat16))),
                       ("a", (TwoTensor(a.clone(), a.clone()), b, out)),
                       ("b", (a, fake.from_tensor(b), out)),
                       ("b", (a, zero((_RK, _RN), dtype=torch.bfloat16)))):  # a new out
        with pytest.raises(ArgumentError, match=f"{name} is a .* with no storage") as info:
            gemm(*args)
        assert info.value.reason == "no-storage" and info.value.tensor == name
    assert len(log) == 1, log  # nothing launched
    with pytest.raises(ArgumentError, match="no storage"):
        torch.vmap(lambda ai: gemm(ai, b, out))(torch.randn(3, _RM, _RK, dtype=torch.bfloat16))


def test_patch_leaves_a_linear_whose_weight_is_a_tensor_subclass_to_torch(built_cache):
    """r51 review: patch() swapped a Linear whose weight was a tensor subclass
    (DTensor, a quantized weight) that reports a kernel dtype; its calls
    handed the kernel a pointer to no values. Such modules are skipped."""
    from torch.testing._internal.two_tensor import TwoTensor  # noqa: PLC0415

    import cutlass_aot.nn as cnn  # noqa: PLC0415

    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    w = lin.weight.detach()
    lin.weight = torch.nn.Parameter(TwoTensor(w.clone(), w.clone()), requires_grad=False)
    report = cnn.patch(torch.nn.Sequential(lin), Cache(built_cache.path))
    assert not report.swapped and report.skipped[0]["reason"] == "subclass", report.skipped
    assert "TwoTensor" in report.skipped[0]["detail"]


@pytest.mark.parametrize("fast", [True, False])
def test_the_version_bump_takes_torch_2_4s_one_tensor_and_never_relaunches(built_cache, fast,
                                                                           monkeypatch):
    """r51 review: torch 2.4 (pyproject allows it) has _increment_version take
    one tensor and refuse a tuple, so every call given out raised after its
    kernel ran; on the C++ path the bump sat in the try whose except falls
    through to the Python launch, so the kernel ran twice first."""
    real = torch._C._increment_version

    def one_tensor(t):  # torch 2.4's signature
        if not isinstance(t, torch.Tensor):
            raise RuntimeError("increment_version expect a Tensor as input")
        real((t,))

    monkeypatch.setattr(torch._C, "_increment_version", one_tensor)
    log = []
    gemm, memoize = _stand_in_runner(built_cache, fast, log)
    a, b, out = _operands()
    memoize(a, b, out)
    before = out._version
    with torch.no_grad():
        for _ in range(2):
            gemm(a, b, out)
    assert len(log) == 2 and out._version == before + 2, (log, out._version)


def test_a_storage_less_c_is_refused_even_where_b_meets_outs_range(built_cache):
    """r51 review: the overlap filter returned on b's range meeting out's
    before it read c's pointer, and the exact check (no element shared) let
    the call launch with a null c."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    runner = GemmRunner(Cache(built_cache.path), fast=False)
    launched = []
    bf = torch.bfloat16
    buf = torch.zeros(_RK, 2 * _RN, dtype=bf)  # b and out: column halves, rows interleaved
    out, b = buf[:_RM if _RM <= _RK else _RK, :_RN], buf[:, _RN:]
    a = torch.randn(out.shape[0], _RK, dtype=bf)
    c = torch._efficientzerotensor(tuple(out.shape), dtype=bf)
    key = (out.shape, out.stride(), out.dtype, a.stride(), b.stride(), a.shape[-1], c.stride(),
           None, None, a.dtype)
    runner._memo[key] = (None, 132, lambda *args: launched.append(args))
    gemm = runner.entry()
    with pytest.raises(ArgumentError, match="c is a .* with no storage"):
        gemm(a, b, out, c=c)
    assert not launched
    gemm(a, b, out, c=torch.zeros_like(out))  # the same layout with a real c: served
    assert len(launched) == 1
