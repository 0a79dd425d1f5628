"""The loader's trust and time-of-check/time-of-use rules, beyond the root:
the bundled runtime is loaded from the bytes that were hashed, the
directories that hold code (``runtime/``, ``runtime/<sha>/``,
``entries/<key>/``) must be trustworthy, a platform without memfd is refused
unless the documented knob accepts path loading, and a record's
signature_text must agree with its signature.

Loads that touch the process-wide runtime run in fresh interpreters.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os

import pytest

from cutlass_aot import IntegrityError
from cutlass_aot.run import load
from cutlass_aot.run.load import Cache
from tests.support import edit_index, load_index_json, run_python, subprocess_env

LOAD_ONE = r"""
import json, os, sys
import cutlass_aot
from cutlass_aot.run import load
if sys.argv[3] == "no-memfd":
    def refuse(*a, **k):
        raise OSError(38, "Function not implemented")
    os.memfd_create = refuse
try:
    cache = cutlass_aot.open_cache(sys.argv[1])
    cache.function(sys.argv[2])
except cutlass_aot.CutlassAotError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": exc.message}))
    sys.exit(0)
maps = [ln.split(None, 5)[5].strip() for ln in open("/proc/self/maps") if len(ln.split(None, 5)) == 6]
print(json.dumps({"maps": sorted(set(maps))}))
"""


def _load(cache, key, mode="normal", **env):
    proc = run_python(LOAD_ONE, cache, key, mode, env=subprocess_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_runtime_is_loaded_from_verified_bytes_not_by_path(built_cache):
    out = _load(built_cache.path, built_cache.keys[0])
    assert "maps" in out, out
    assert not any(m.endswith("libcute_dsl_runtime.so") for m in out["maps"]), \
        [m for m in out["maps"] if "cute_dsl" in m]
    assert any(m.startswith("/memfd:cutlass-aot-runtime") for m in out["maps"])
    assert any(m.startswith("/memfd:cutlass-aot-artifact") for m in out["maps"])


@pytest.mark.parametrize("where", ["runtime", "runtime/<sha>", "entries/<key>"])
def test_world_writable_code_directories_are_refused(cache_copy, built_cache, where):
    index = load_index_json(cache_copy)
    sha = next(iter(index["runtimes"]))
    key = built_cache.keys[0]
    path = cache_copy / where.replace("<sha>", sha).replace("<key>", key)
    os.chmod(path, os.stat(path).st_mode | 0o002)
    out = _load(cache_copy, key)
    assert out.get("error") == "CacheError", out
    assert "world-writable" in out["message"] and str(path) in out["message"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_entry_dir_owned_by_a_stranger_is_refused(cache_copy, built_cache):
    key = built_cache.keys[0]
    os.chown(cache_copy / "entries" / key, 4242, 4242)
    out = _load(cache_copy, key)
    assert out.get("error") == "CacheError" and "owned by uid 4242" in out["message"], out


def test_without_memfd_loading_is_refused_unless_opted_in(built_cache):
    key = built_cache.keys[0]
    out = _load(built_cache.path, key, "no-memfd")
    assert out.get("error") == "CacheError", out
    assert "CUTLASS_AOT_ALLOW_PATH_LOAD=1" in out["message"]
    out = _load(built_cache.path, key, "no-memfd", CUTLASS_AOT_ALLOW_PATH_LOAD="1")
    assert "maps" in out, out
    assert any(m.endswith("libcute_dsl_runtime.so") for m in out["maps"])


def test_signature_text_that_disagrees_with_the_signature_is_refused(cache_copy, built_cache):
    """Two records with one signature_text but different signatures: the second
    must not borrow the first's signature (it would serve calls it cannot)."""
    k1, k2 = built_cache.keys[:2]
    index = load_index_json(cache_copy)
    assert index["entries"][k1]["signature"] != index["entries"][k2]["signature"]
    edit_index(cache_copy, lambda d: d["entries"][k2].update(signature_text=d["entries"][k1]["signature_text"]))
    with pytest.raises(IntegrityError, match="signature_text"):
        Cache(cache_copy)


def test_signature_text_alone_is_checked_too(cache_copy, built_cache):
    k = built_cache.keys[0]
    edit_index(cache_copy, lambda d: d["entries"][k].update(signature_text="gemm[sm_90a](a=f16)"))
    with pytest.raises(IntegrityError, match="signature_text"):
        Cache(cache_copy)


def test_runtime_bytes_are_copied_hashed_and_sealed_in_a_memfd(tmp_path):
    """The runtime's bytes reach a sealed memfd through the kernel and are hashed
    there: the matching file gives a descriptor holding exactly its bytes, which
    nothing can write any more; another file, or a wrong digest, gives None and
    leaves no descriptor open."""
    blob = os.urandom(3 * 1024 * 1024 + 17)
    lib = tmp_path / "libcute_dsl_runtime.so"
    lib.write_bytes(blob)
    sha = hashlib.sha256(blob).hexdigest()
    open_before = len(os.listdir("/proc/self/fd"))
    fd = load._runtime_bytes(lib, sha)
    assert isinstance(fd, int)
    try:
        assert os.pread(fd, len(blob) + 1, 0) == blob
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_GROW
        with pytest.raises(OSError):
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)
    assert load._runtime_bytes(lib, "0" * 64) is None
    (tmp_path / "empty.so").write_bytes(b"")
    assert load._runtime_bytes(tmp_path / "empty.so", hashlib.sha256(b"").hexdigest()) is None
    assert len(os.listdir("/proc/self/fd")) == open_before


def _runtime_without(tmp_path, monkeypatch, call: str, size: int):
    """A random runtime file of ``size`` bytes, with ``os.<call>`` failing as
    an old kernel or an odd file system would: (its path, its bytes)."""
    blob = os.urandom(size)
    lib = tmp_path / "libcute_dsl_runtime.so"
    lib.write_bytes(blob)

    def refuse(*_a, **_k):
        raise OSError(38, f"{call}: Function not implemented")

    monkeypatch.setattr(os, call, refuse)
    return lib, blob


def test_runtime_bytes_without_memfd_are_read_and_hashed(tmp_path, monkeypatch):
    lib, blob = _runtime_without(tmp_path, monkeypatch, "memfd_create", 4096)
    assert load._runtime_bytes(lib, hashlib.sha256(blob).hexdigest()) == blob
    assert load._runtime_bytes(lib, "0" * 64) is None


def test_runtime_bytes_survive_a_file_system_without_sendfile(tmp_path, monkeypatch):
    """Where sendfile is refused, the bytes are copied through user space into
    the same sealed memfd (not rejected as a mismatch)."""
    lib, blob = _runtime_without(tmp_path, monkeypatch, "sendfile", 70000)
    fd = load._runtime_bytes(lib, hashlib.sha256(blob).hexdigest())
    assert isinstance(fd, int)
    try:
        assert os.pread(fd, len(blob) + 1, 0) == blob
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    finally:
        os.close(fd)
