"""push/pull against a real registry (Debian's docker-registry), with faults.

Every test speaks to a real CNCF distribution registry started on 127.0.0.1
(tests/registry.py), plain, with htpasswd basic auth, or with TLS from a
self-signed certificate. Caches are the session's real build (conftest).
The CLI runs as a subprocess, so exit codes and kill -9 are real.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from cutlass_aot.builder.store import CacheStore
from cutlass_aot.errors import RegistryError, UsageError
from cutlass_aot.layout import read_index
from cutlass_aot.remote.client import Client
from cutlass_aot.remote.reference import DOCKER_HUB, parse
from tests.registry import CuttingProxy, HookProxy, RegistryServer, self_signed
from tests.support import cli_argv, flip_byte, run_cli, run_cli_json, sha256, subprocess_env


# ------------------------------------------------------------------ helpers
def entries_of(cache: Path) -> dict[str, str]:
    return {k: r["sha256"] for k, r in json.loads((cache / "index.json").read_text())["entries"].items()}


def assert_clean(cache: Path) -> None:
    rc, out, err = run_cli_json("verify", "--cache-dir", cache)
    assert rc == 0 and out["ok"], (out, err)


def assert_nothing_partial(cache: Path, full: dict[str, str]) -> set[str]:
    """What a reader sees now: no index, or an index listing none or all of ``full``, verified."""
    if not (cache / "index.json").exists():
        return set()
    index = read_index(cache)
    seen = set(index["entries"])
    assert seen in (set(), set(full)), f"a reader sees {len(seen)} of {len(full)} entries"
    assert not CacheStore(cache).verify()["problems"]
    return seen


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = RegistryServer(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pushed(registry, built_cache):
    ref = f"{registry.host}/kernels/tiny:v1"
    rc, out, err = run_cli_json("push", "--cache-dir", built_cache.path, ref, "--plain-http")
    assert rc == 0, (out, err)
    return ref, out


# --------------------------------------------------------------- reference
def test_reference_grammar():
    r = parse("127.0.0.1:5000/kernels/sm90:ci")
    assert (r.registry, r.repository, r.tag, r.digest) == ("127.0.0.1:5000", "kernels/sm90", "ci", None)
    assert parse("ghcr.io/acme/k").tag == "latest"
    assert parse("kernels").registry == DOCKER_HUB and parse("kernels").repository == "library/kernels"
    d = "sha256:" + "a" * 64
    assert parse(f"localhost/k@{d}").target == d
    assert parse("[::1]:5000/k").registry == "[::1]:5000"
    for bad in ("", "Host.io/UPPER:x", "h.io/k:bad tag", "h.io/k@sha256:xyz", "127.0.0.1:abc/k:v",
                "127.0.0.1:99999/k", "h.io:/k", "h_x.io/k", "[::1]x/k"):
        with pytest.raises(UsageError):
            parse(bad)


# ---------------------------------------------------------------- push/pull
def test_push_uploads_only_missing_blobs(registry, built_cache, pushed):
    ref, first = pushed
    index = read_index(built_cache.path)
    blobs = {r["sha256"] for r in index["entries"].values()} | set(index["runtimes"])
    assert first["blobs"] == len(blobs) + 1 and first["blobs_transferred"] == first["blobs"]
    assert first["bytes"] >= sum(r["size"] for r in index["entries"].values())
    for sha in blobs:  # digests are the index's sha256s, stored as such by the registry
        assert registry.blob_file(sha).is_file()
    rc, again, err = run_cli_json("push", "--cache-dir", built_cache.path, ref, "--plain-http")
    assert rc == 0 and again["blobs_transferred"] == 0 and again["bytes"] == 0, (again, err)
    assert again["digest"] == first["digest"]


def test_pull_into_empty_dir_is_the_same_cache(built_cache, pushed, tmp_path):
    ref, _ = pushed
    dst = tmp_path / "pulled"
    rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http", "--arch", "sm_90a")
    assert rc == 0, (out, err)
    assert out["entries"] == len(built_cache.keys) and out["blobs_transferred"] == out["blobs"]
    assert entries_of(dst) == entries_of(built_cache.path)
    for key in built_cache.keys:  # artifacts and records byte for byte
        for name in ("kernel.so", "entry.json"):
            assert (dst / "entries" / key / name).read_bytes() == \
                (built_cache.path / "entries" / key / name).read_bytes()
    assert_clean(dst)
    assert not list((dst / "tmp").glob("pull-*")), "verified blobs are removed after the commit"
    rc, again, _ = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http")
    assert rc == 0 and again["blobs_transferred"] == 0 and again["present"] == len(built_cache.keys)


def test_pull_fetches_only_what_is_asked_and_lacking(built_cache, pushed, tmp_path):
    ref, _ = pushed
    dst = tmp_path / "pulled"
    rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http", "--signature", "*c=bf16*")
    assert rc == 0, err
    index = read_index(dst)
    assert out["entries"] == 1 and [r["signature"]["fields"]["c"] for r in index["entries"].values()] == ["bf16"]
    # the runtime came along once; the next pull downloads only the two other artifacts
    rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http")
    assert rc == 0 and out["entries"] == 2 and out["blobs_transferred"] == 2, (out, err)
    assert_clean(dst)
    rc, out, err = run_cli_json("pull", ref, "--cache-dir", tmp_path / "none", "--plain-http", "--arch", "sm_80")
    assert rc == 2 and "sm_90a" in out["message"]
    assert not (tmp_path / "none").exists()


def test_clear_errors_exit_1(registry, pushed, tmp_path):
    ref, _ = pushed
    dst = tmp_path / "dst"
    res = run_cli("pull", f"{registry.host}/kernels/tiny:missing", "--cache-dir", dst, "--plain-http")
    assert res.returncode == 1 and "not found" in res.stderr and "missing" in res.stderr
    res = run_cli("pull", ref.replace(registry.host, f"127.0.0.1:{_closed_port()}"), "--cache-dir", dst,
                  "--plain-http")
    assert res.returncode == 1 and "cannot reach registry" in res.stderr
    res = run_cli("pull", ref, "--cache-dir", dst)  # TLS by default; this registry is plain
    assert res.returncode == 1 and "--plain-http" in res.stderr
    res = run_cli("pull", "NOT A REF", "--cache-dir", dst)
    assert res.returncode == 2
    assert not dst.exists(), "failed pulls write nothing"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_extra_index_files_travel(built_cache, tmp_path):
    """Any index section of {path, sha256} records (the selection table) goes
    along; such files are content-addressed (<section>/<sha256>[.ext])."""
    src = tmp_path / "src"
    shutil.copytree(built_cache.path, src)
    body = b'{"rows": [1, 2, 3]}\n'
    digest = hashlib.sha256(body).hexdigest()
    table = src / "selection" / f"{digest}.json"
    table.parent.mkdir()
    table.write_bytes(body)
    CacheStore(src).update_index(lambda idx: idx.update(selection={"sm_90a": {
        "path": f"selection/{digest}.json", "sha256": digest, "size": len(body)}}))
    server = RegistryServer(tmp_path / "reg").start()
    try:
        ref = f"{server.host}/kernels/extra:v1"
        assert run_cli("push", "--cache-dir", src, ref, "--plain-http").returncode == 0
        dst = tmp_path / "dst"
        res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http")
        assert res.returncode == 0, res.stderr
    finally:
        server.stop()
    assert (dst / "selection" / f"{digest}.json").read_bytes() == body
    assert read_index(dst)["selection"]["sm_90a"]["sha256"] == sha256(table)
    merged = tmp_path / "merged"
    assert run_cli("merge", src, "--cache-dir", merged).returncode == 0
    assert (merged / "selection" / f"{digest}.json").read_bytes() == body


# ------------------------------------------------------------------- faults
def test_tampered_blob_is_refused_before_publishing(built_cache, tmp_path):
    server = RegistryServer(tmp_path / "reg").start()
    try:
        ref = f"{server.host}/kernels/tiny:v1"
        assert run_cli("push", "--cache-dir", built_cache.path, ref, "--plain-http").returncode == 0
        key = built_cache.keys[0]
        victim = server.blob_file(read_index(built_cache.path)["entries"][key]["sha256"])
        flip_byte(victim)  # same size, other bytes: the registry serves them as they are
        dst = tmp_path / "dst"
        res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http")
        assert res.returncode == 1, res.stderr
        assert "do not match its digest" in res.stderr and "nothing was published" in res.stderr
        assert not (dst / "index.json").exists()
        assert not list((dst / "entries").iterdir())
        assert not list((dst / "tmp").glob("pull-*.part")), "a blob that failed its digest is not kept"
        with open(victim, "r+b") as f:  # a truncated blob is refused from its length alone
            f.truncate(victim.stat().st_size // 2)
        res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http")
        assert res.returncode == 1 and "bytes, not" in res.stderr, res.stderr
        assert not (dst / "index.json").exists()
    finally:
        server.stop()


def test_registry_stopped_mid_pull(built_cache, tmp_path):
    server = RegistryServer(tmp_path / "reg").start()
    ref_path = "kernels/tiny:v1"
    assert run_cli("push", "--cache-dir", built_cache.path, f"{server.host}/{ref_path}",
                   "--plain-http").returncode == 0
    proxy = CuttingProxy(server, limit=8 << 20)  # inside the 43 MB runtime library
    dst = tmp_path / "dst"
    res = run_cli("pull", f"{proxy.host}/{ref_path}", "--cache-dir", dst, "--plain-http")
    assert proxy.cut.is_set()
    assert res.returncode == 1, res.stderr
    assert "broke while downloading" in res.stderr and "resumes" in res.stderr, res.stderr
    assert not (dst / "index.json").exists(), "nothing of a failed pull is visible"
    kept = sum(p.stat().st_size for p in (dst / "tmp").glob("pull-*"))
    assert kept > 0
    server.start()  # same storage, same port: the registry is back
    try:
        rc, out, err = run_cli_json("pull", f"{server.host}/{ref_path}", "--cache-dir", dst, "--plain-http")
        assert rc == 0, (out, err)
        assert out["bytes"] < sum(b for b in _blob_sizes(built_cache.path)), "the pull resumed"
        assert entries_of(dst) == entries_of(built_cache.path)
        assert_clean(dst)
    finally:
        server.stop()


def test_a_disk_that_refuses_the_blob_is_a_disk_error_and_the_pull_resumes(built_cache, pushed, tmp_path):
    """A write that fails under a pull (here a file size limit, as `ulimit -f`
    sets it, so the kernel's own EFBIG, inside the 43 MB runtime blob) is the
    disk's problem, not the registry's: exit 2 with the other writers' disk
    message (r49 said the connection "broke", exit 1), nothing published, the
    bytes written kept, and a pull without the limit resumes from them."""
    ref, _ = pushed
    dst = tmp_path / "dst"
    limit = 8 << 20
    cap = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
           "from cutlass_aot.cli import main; sys.argv[0] = 'cutlass-aot'; main()")
    proc = subprocess.run([cli_argv()[0], "-c", cap, "pull", ref, "--cache-dir", str(dst), "--plain-http"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "file size limit" in proc.stderr, proc.stderr
    assert "broke" not in proc.stderr
    assert not (dst / "index.json").exists(), "nothing of a failed pull is visible"
    assert any(p.stat().st_size == limit for p in (dst / "tmp").rglob("*") if p.is_file()), "kept to resume"
    rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http")
    assert rc == 0, (out, err)
    assert out["bytes"] < sum(_blob_sizes(built_cache.path)), "the pull resumed"
    assert entries_of(dst) == entries_of(built_cache.path)
    assert_clean(dst)


def _blob_sizes(cache: Path) -> list[int]:
    index = read_index(cache)
    return [r["size"] for r in index["entries"].values()] + [r["size"] for r in index["runtimes"].values()]


def test_kill_9_pull_at_random_moments(built_cache, pushed, tmp_path):
    """kill -9 at random moments: a reader sees none or all; the next pull completes."""
    ref, _ = pushed
    full = entries_of(built_cache.path)
    probe = tmp_path / "probe"
    t0 = time.monotonic()
    assert run_cli("pull", ref, "--cache-dir", probe, "--plain-http").returncode == 0
    span = time.monotonic() - t0
    rng = random.Random(13)
    dst = tmp_path / "dst"
    outcomes = []
    for _ in range(int(os.environ.get("CUTLASS_AOT_TEST_KILLS", "5"))):
        if (dst / "index.json").exists() and entries_of(dst) == full:
            shutil.rmtree(dst)  # that pull had committed: start over, so each kill hits real work
        proc = subprocess.Popen(cli_argv("pull", ref, "--cache-dir", dst, "--plain-http"),
                                env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.0) * span)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        outcomes.append(len(assert_nothing_partial(dst, full)))
    res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http")
    assert res.returncode == 0, res.stderr
    assert entries_of(dst) == full
    assert_clean(dst)
    print("entries visible after each kill:", outcomes)


def test_pull_after_a_kill_between_last_byte_and_rename(built_cache, registry, pushed, tmp_path):
    """A kill after a blob's last byte, before its rename, leaves a whole ``.part``.

    The resume must not ask for the bytes past the end: the registry answers that
    range with 416 and a Content-Length of the whole blob over a 33-byte body
    (the CI failure at 3e1c95a). A whole part is checked and kept; a damaged one
    of the same size is dropped and fetched again.
    """
    ref, _ = pushed
    index = read_index(built_cache.path)
    sizes = {r["sha256"]: r["size"] for r in [*index["entries"].values(), *index["runtimes"].values()]}
    sha = max(sizes, key=sizes.get)
    for case in ("whole", "damaged"):
        dst = tmp_path / case
        (dst / "tmp").mkdir(parents=True)
        part = dst / "tmp" / f"pull-{sha}.part"
        shutil.copyfile(registry.blob_file(sha), part)
        if case == "damaged":
            flip_byte(part)
        rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http")
        assert rc == 0, (case, out, err)
        fetched = sum(sizes.values()) - (sizes[sha] if case == "whole" else 0)
        assert out["bytes"] == fetched, (case, out)
        assert entries_of(dst) == entries_of(built_cache.path)
        assert_clean(dst)
        assert not part.exists()
    # The same empty range asked directly: a RegistryError with the status, and
    # the client still works after the lying Content-Length.
    client = Client(parse(ref), plain_http=True)
    with pytest.raises(RegistryError) as caught:
        client.open_blob(f"sha256:{sha}", offset=sizes[sha])
    assert caught.value.data["status"] == 416
    assert client.blob_exists(f"sha256:{sha}")
    client.close()


# -------------------------------------------------------------- auth, TLS
def test_basic_auth(built_cache, tmp_path):
    server = RegistryServer(tmp_path / "reg", user=("ci", "s3cret")).start()
    ref = f"{server.host}/kernels/tiny:v1"
    try:
        home = tmp_path / "home"
        env = subprocess_env(HOME=str(home), DOCKER_CONFIG=None, CUTLASS_AOT_REGISTRY_USER=None,
                             CUTLASS_AOT_REGISTRY_PASSWORD=None, CUTLASS_AOT_REGISTRY_HOST=None)
        res = run_cli("push", "--cache-dir", built_cache.path, ref, "--plain-http", env=env)
        assert res.returncode == 1 and "401" in res.stderr and "docker login" in res.stderr
        bad = env | {"CUTLASS_AOT_REGISTRY_USER": "ci", "CUTLASS_AOT_REGISTRY_PASSWORD": "wrong",
                     "CUTLASS_AOT_REGISTRY_HOST": server.host}
        res = run_cli("push", "--cache-dir", built_cache.path, ref, "--plain-http", env=bad)
        assert res.returncode == 1 and "refused the credentials" in res.stderr
        good = env | {"CUTLASS_AOT_REGISTRY_USER": "ci", "CUTLASS_AOT_REGISTRY_PASSWORD": "s3cret",
                      "CUTLASS_AOT_REGISTRY_HOST": server.host}
        res = run_cli("push", "--cache-dir", built_cache.path, ref, "--plain-http", env=good)
        assert res.returncode == 0, res.stderr
        # docker's config.json, as `docker login` writes it
        import base64  # noqa: PLC0415

        (home / ".docker").mkdir(parents=True)
        (home / ".docker" / "config.json").write_text(json.dumps(
            {"auths": {server.host: {"auth": base64.b64encode(b"ci:s3cret").decode()}}}))
        res = run_cli("pull", ref, "--cache-dir", tmp_path / "a", "--plain-http", env=env)
        assert res.returncode == 0, res.stderr
        # a credential helper (the docker-credential-* protocol), through credHelpers
        bindir = tmp_path / "bin"
        bindir.mkdir()
        helper = bindir / "docker-credential-cutlasstest"
        helper.write_text("#!/bin/sh\nread host\n"
                          f"[ \"$host\" = \"{server.host}\" ] || exit 1\n"
                          "echo '{\"Username\": \"ci\", \"Secret\": \"s3cret\"}'\n")
        helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
        (home / ".docker" / "config.json").write_text(json.dumps({"credHelpers": {server.host: "cutlasstest"}}))
        henv = env | {"PATH": f"{bindir}{os.pathsep}{env['PATH']}"}
        res = run_cli("pull", ref, "--cache-dir", tmp_path / "b", "--plain-http", env=henv)
        assert res.returncode == 0, res.stderr
        assert entries_of(tmp_path / "b") == entries_of(built_cache.path)
    finally:
        server.stop()


def test_tls(built_cache, tmp_path):
    server = RegistryServer(tmp_path / "reg", tls=True).start()
    ref = f"{server.host}/kernels/tiny:v1"
    try:
        res = run_cli("push", "--cache-dir", built_cache.path, ref)
        assert res.returncode == 1 and "not trusted" in res.stderr and "--ca-file" in res.stderr
        res = run_cli("push", "--cache-dir", built_cache.path, ref, "--ca-file", server.ca_file)
        assert res.returncode == 0, res.stderr
        res = run_cli("pull", ref, "--cache-dir", tmp_path / "a",
                      env=subprocess_env(CUTLASS_AOT_REGISTRY_CA=server.ca_file))
        assert res.returncode == 0, res.stderr
        assert_clean(tmp_path / "a")
        res = run_cli("pull", ref, "--cache-dir", tmp_path / "b", "--plain-http")
        assert res.returncode == 1 and "HTTPS" in res.stderr
    finally:
        server.stop()


def test_credentials_lookup_order(tmp_path, monkeypatch):
    """env, then credHelpers / credsStore (real helper processes), then auths."""
    import base64  # noqa: PLC0415

    from cutlass_aot.remote import auth  # noqa: PLC0415

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("CUTLASS_AOT_REGISTRY_USER", raising=False)
    monkeypatch.delenv("CUTLASS_AOT_REGISTRY_PASSWORD", raising=False)
    monkeypatch.delenv("CUTLASS_AOT_REGISTRY_HOST", raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, known in (("store", "reg.example:5000"), ("empty", "")):
        helper = bindir / f"docker-credential-{name}"
        helper.write_text(f"#!/bin/sh\nread host\n[ \"$host\" = \"{known}\" ] || "
                          "{ echo 'credentials not found in native keychain'; exit 1; }\n"
                          "echo '{\"Username\": \"from-store\", \"Secret\": \"pw\"}'\n")
        helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    cfg = tmp_path / "config.json"
    assert auth.find("reg.example:5000") is None  # no config at all: anonymous
    cfg.write_text(json.dumps({
        "credsStore": "store",
        "credHelpers": {"other.example": "empty"},
        "auths": {"https://other.example/v1/": {"auth": base64.b64encode(b"u:p").decode()},
                  "https://index.docker.io/v1/": {"username": "hub", "password": "hp"}},
    }))
    found = auth.find("reg.example:5000")
    assert (found.username, found.password) == ("from-store", "pw") and "docker-credential-store" in found.source
    found = auth.find("other.example")  # its helper has nothing: falls through to auths
    assert (found.username, found.password) == ("u", "p")
    assert auth.find("registry-1.docker.io").username == "hub"  # docker login's v1 key for Docker Hub
    assert auth.find("unknown.example") is None
    monkeypatch.setenv("CUTLASS_AOT_REGISTRY_USER", "env")
    monkeypatch.setenv("CUTLASS_AOT_REGISTRY_PASSWORD", "envpw")
    monkeypatch.setenv("CUTLASS_AOT_REGISTRY_HOST", "reg.example:5000")
    assert auth.find("reg.example:5000").username == "env"
    assert auth.find("other.example").username == "u"  # the env pair is reg.example's alone
    monkeypatch.delenv("CUTLASS_AOT_REGISTRY_USER")
    # `docker login` with a credsStore keeps Docker Hub's under its v1 address
    # (and marks it in auths with an empty entry); r49 asked only bare names.
    hub = bindir / "docker-credential-hub"
    hub.write_text("#!/bin/sh\nread host\n[ \"$host\" = \"https://index.docker.io/v1/\" ] || "
                   "{ echo 'credentials not found in native keychain'; exit 1; }\n"
                   "echo '{\"Username\": \"hub-store\", \"Secret\": \"hs\"}'\n")
    hub.chmod(0o755)
    cfg.write_text(json.dumps({"credsStore": "hub", "auths": {"https://index.docker.io/v1/": {}}}))
    for host in ("registry-1.docker.io", "docker.io"):
        found = auth.find(host)
        assert found is not None and (found.username, found.password) == ("hub-store", "hs"), host
    cfg.write_text(json.dumps({"credsStore": "hub"}))  # no auths marker: the v1 address is still asked
    assert auth.find("registry-1.docker.io").username == "hub-store"
    assert auth.find("reg.example:5000") is None  # the hub store has nothing for other hosts


def _table(cache: Path, ms: list[int]) -> dict:
    rec = next(iter(read_index(cache)["entries"].values()))
    rows = [{"signature": rec["signature_text"], "family": rec["family"], "kernel_sources": "x" * 64,
             "m": m, "n": 4096, "k": 4096, "l": 1, "splits": 1, "us": 10.0 + m,
             "variant": {"tile": rec["variant"]["tile"], "cluster": rec["variant"]["cluster"]}} for m in ms]
    return {"format": "cutlass-aot-selection", "version": 1, "rows": rows,
            "gpu": {"name": "NVIDIA H200", "sm_count": 132, "capability": "9.0"}}


def test_selection_tables_of_one_gpu_merge_rows(built_cache, tmp_path):
    """Two caches tuned on one GPU kind: merge and pull merge their tables' rows."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(built_cache.path, a)
    shutil.copytree(built_cache.path, b)
    CacheStore(a).publish_table(_table(a, [1, 2]))
    CacheStore(b).publish_table(_table(b, [2, 3]))
    merged = tmp_path / "merged"
    shutil.copytree(a, merged)
    rc, out, err = run_cli_json("merge", b, "--cache-dir", merged)
    assert rc == 0 and out["ok"] and out["files_added"], (out, err)
    gpu = _table(a, [])["gpu"]
    assert sorted(r["m"] for r in CacheStore(merged).table_rows(gpu)) == [1, 2, 3]
    assert_clean(merged)
    server = RegistryServer(tmp_path / "reg").start()
    try:
        ref = f"{server.host}/kernels/tuned:v1"
        assert run_cli("push", "--cache-dir", b, ref, "--plain-http").returncode == 0
        rc, out, err = run_cli_json("pull", ref, "--cache-dir", a, "--plain-http")
        assert rc == 0 and out["files"] == 1, (out, err)
    finally:
        server.stop()
    assert sorted(r["m"] for r in CacheStore(a).table_rows(gpu)) == [1, 2, 3]
    assert_clean(a)


# ----------------------------------------------------- a registry that lies
def _push_bundle(ref: str, config: dict, files: list[bytes] = (), src: Path | None = None) -> None:
    """Upload ``config`` (a bundle document, maybe tampered with), ``files``,
    the blobs of cache ``src`` and a manifest, through the client as push
    would: what a hostile or broken publisher can put in a registry."""
    from cutlass_aot.remote import bundle  # noqa: PLC0415

    if src is not None:
        files = [*files, *((src / b.path).read_bytes() for b in bundle.local_bundle(src)[1])]

    client = Client(parse(ref), plain_http=True, actions="pull,push")
    try:
        def up(data: bytes) -> str:
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            if not client.blob_exists(digest):
                client.upload_blob(digest, len(data), lambda: data)
            return digest
        for data in files:
            up(data)
        body = bundle.dumps(config)
        man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
               "config": {"mediaType": bundle.CONFIG_TYPE, "digest": up(body), "size": len(body)},
               "layers": []}
        client.put_manifest(bundle.dumps(man))
    finally:
        client.close()


def test_a_config_cannot_place_files_outside_their_own_names(built_cache, registry, pushed, tmp_path):
    """An index listing an extra file at an entry's artifact, at index.json or
    with a sha256 that is a path, or an entry whose path is not its own, is
    refused before anything is written; the cache pulled before is intact."""
    from cutlass_aot.remote import bundle  # noqa: PLC0415

    ref, _ = pushed
    dst = tmp_path / "dst"
    assert run_cli("pull", ref, "--cache-dir", dst, "--plain-http").returncode == 0
    before = {p: p.read_bytes() for p in dst.rglob("*") if p.is_file() and "locks" not in p.parts}
    config, _ = bundle.local_bundle(built_cache.path)
    key = sorted(config["index"]["entries"])[0]
    evil = b"not a kernel\n"
    good = hashlib.sha256(evil).hexdigest()
    other = sorted(config["index"]["entries"])[1]
    cases = {  # what the index says -> what the refusal names
        "extra over an artifact": ("notes", {"x": {"path": f"entries/{key}/kernel.so", "sha256": good,
                                                    "size": len(evil)}}, "content-addressed"),
        "extra over the index": ("notes", {"x": {"path": "index.json", "sha256": good}},
                                 "content-addressed"),
        "extra in a reserved dir": ("tmp", {"x": {"path": f"tmp/{good}", "sha256": good}}, "reserves"),
        "sha256 that is a path": ("notes", {"x": {"path": f"notes/{good}", "size": len(evil),
                                                   "sha256": "/../../../../" + "a" * 51}}, "64 lowercase hex"),
        "size that is not a count": ("notes", {"x": {"path": f"notes/{good}", "sha256": good, "size": "abc"}},
                                     "count of bytes"),
        "entry at another path": ("entry", "../../etc/x", "is not entries/<key>/kernel.so"),
        "entry at another entry's file": ("entry", f"entries/{other}/kernel.so",
                                          "is not entries/<key>/kernel.so"),
    }
    for n, (name, value, refusal) in enumerate(cases.values()):
        cfg = json.loads(json.dumps(config))
        if name != "entry":
            cfg["index"][name] = value
        else:
            name = value
            cfg["index"]["entries"][key]["path"] = name
            full = json.loads(cfg["records"][key])
            full["path"] = name
            cfg["records"][key] = json.dumps(full)
        bad_ref = ref.rsplit(":", 1)[0] + f":evil{n}"
        _push_bundle(bad_ref, cfg, [evil])
        for target in (dst, tmp_path / f"fresh{n}"):
            res = run_cli("pull", bad_ref, "--cache-dir", target, "--plain-http")
            assert res.returncode == 1 and "Traceback" not in res.stderr, (list(cases)[n], res.stderr)
            assert refusal in res.stderr, (list(cases)[n], res.stderr)
        assert not list(tmp_path.glob("*.lock")), "a lock file outside the cache"
        after = {p: p.read_bytes() for p in dst.rglob("*") if p.is_file() and "locks" not in p.parts}
        assert after == before, f"{list(cases)[n]}: a refused pull changed the cache"
    assert_clean(dst)


def test_a_table_that_is_not_a_table_is_refused_before_the_commit(built_cache, registry, tmp_path):
    """A selection table whose bytes match its digest but do not parse, or that
    measured another GPU than its slot, fails the pull before any entry lands:
    into a cache with its own table for the slot (rows would merge) and into
    one without."""
    src = tmp_path / "src"
    shutil.copytree(built_cache.path, src)
    from cutlass_aot.remote import bundle  # noqa: PLC0415

    have = tmp_path / "have"
    shutil.copytree(built_cache.path, have)
    CacheStore(have).publish_table(_table(have, [1]))
    # one entry fewer, so that a pull would have something to add
    victim = sorted(read_index(have)["entries"])[0]
    CacheStore(have).update_index(lambda idx: idx["entries"].pop(victim))
    shutil.rmtree(have / "entries" / victim)
    config, _ = bundle.local_bundle(src)
    slot = "NVIDIA H200|132|9.0"
    other = dict(_table(src, [5]), gpu={"name": "NVIDIA H100", "sm_count": 132, "capability": "9.0"})
    for n, data in enumerate([b"this is not json\n", json.dumps(other).encode()]):
        digest = hashlib.sha256(data).hexdigest()
        cfg = json.loads(json.dumps(config))
        cfg["index"]["tables"] = {slot: {"path": f"tables/{digest}.json", "sha256": digest, "size": len(data),
                                         "gpu": _table(src, [])["gpu"], "rows": 1, "published_at": "x"}}
        ref = f"{registry.host}/kernels/badtable:v{n}"
        _push_bundle(ref, cfg, [data], src=src)
        for dst in (have, tmp_path / f"empty{n}"):
            entries = set(read_index(dst)["entries"]) if (dst / "index.json").exists() else set()
            res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http")
            assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
            assert ("is not JSON" in res.stderr) if n == 0 else ("measured" in res.stderr), res.stderr
            now = set(read_index(dst)["entries"]) if (dst / "index.json").exists() else set()
            assert now == entries, "entries landed before the table was checked"
    assert_clean(have)


def test_credentials_never_follow_a_redirect_to_another_host(built_cache, tmp_path):
    """Blob downloads redirected to a storage host that asks for credentials:
    it gets none (and its presigned query never reaches a message)."""
    server = RegistryServer(tmp_path / "reg", user=("ci", "s3cret")).start()
    storage = HookProxy(hook=lambda m, p, h: (401, [("WWW-Authenticate", 'Basic realm="s3"')], b"no"))

    def front_hook(method, path, headers):
        if "/blobs/" in path and method == "GET":
            return (307, [("Location", f"http://{storage.host}/data?X-Amz-Signature=SECRETSIG")], b"")
        return None

    front = HookProxy(server.host, hook=front_hook)
    try:
        ref = f"{server.host}/kernels/tiny:v1"
        env = subprocess_env(CUTLASS_AOT_REGISTRY_USER="ci", CUTLASS_AOT_REGISTRY_PASSWORD="s3cret",
                             CUTLASS_AOT_REGISTRY_HOST=server.host)
        assert run_cli("push", "--cache-dir", built_cache.path, ref, "--plain-http", env=env).returncode == 0
        res = run_cli("pull", f"{front.host}/kernels/tiny:v1", "--cache-dir", tmp_path / "dst",
                      "--plain-http", env=env | {"CUTLASS_AOT_REGISTRY_HOST": front.host})
        assert res.returncode == 1 and "sends only to" in res.stderr, res.stderr
        assert "SECRETSIG" not in res.stderr and "s3cret" not in res.stderr
        assert storage.log and not any("Authorization" in h for _, _, h in storage.log)
    finally:
        for proxy in (front, storage):
            proxy.stop()
        server.stop()


def test_a_lying_token_endpoint_or_body_size_is_a_clear_error(registry, built_cache, pushed, tmp_path):
    """A bearer token with a line break (never printed), a manifest that
    announces a terabyte, a blob that runs past its size: RegistryError or
    IntegrityError, no traceback, nothing kept past the recorded size."""
    ref, _ = pushed
    path = ref.split("/", 1)[1]
    tokens = HookProxy(hook=lambda m, p, h: (200, [("Content-Type", "application/json")],
                                             json.dumps({"token": "sekrit-tok\r\nX-Evil: 1"}).encode()))

    def bearer(method, p, headers):
        if "Authorization" not in headers:
            return (401, [("WWW-Authenticate", f'Bearer realm="http://{tokens.host}/token",service="r"')],
                    b"")
        return None

    huge = {"manifest": lambda m, p, h: (200, [("Content-Length", str(1 << 40))], b"{}")
            if "/manifests/" in p else None}
    index = read_index(built_cache.path)
    key = sorted(index["entries"])[0]
    sha, size = index["entries"][key]["sha256"], index["entries"][key]["size"]

    def longer(method, p, answer):
        status, headers, data = answer
        if p.endswith(sha) and method == "GET":
            return (status, headers, data + b"\0" * (8 << 20))
        return None

    cases = [(HookProxy(registry.host, hook=bearer), "not visible ASCII"),
             (HookProxy(registry.host, hook=huge["manifest"]), "more than the"),
             (HookProxy(registry.host, post=longer), "do not match its digest")]
    try:
        for n, (proxy, message) in enumerate(cases):
            dst = tmp_path / f"dst{n}"
            res = run_cli("pull", f"{proxy.host}/{path}", "--cache-dir", dst, "--plain-http")
            assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
            assert "sekrit" not in res.stderr
            parts = list(dst.rglob("*.part")) if dst.exists() else []
            assert all(p.stat().st_size <= size + 1 for p in parts)
    finally:
        for proxy, _ in cases:
            proxy.stop()
        tokens.stop()


def test_push_checks_the_digest_the_registry_answers(registry, built_cache):
    """A registry (or proxy) that answers the manifest PUT with another digest
    than the manifest's own: the push fails instead of reporting it."""
    def lie(method, path, answer):
        status, headers, data = answer
        if method == "PUT" and "/manifests/" in path:
            headers = [(k, v) for k, v in headers if k.lower() != "docker-content-digest"]
            return (status, headers + [("Docker-Content-Digest", "sha256:" + "f" * 64)], data)
        return None

    proxy = HookProxy(registry.host, post=lie)
    try:
        rc, out, err = run_cli_json("push", "--cache-dir", built_cache.path, f"{proxy.host}/kernels/lie:v1",
                                    "--plain-http")
        assert rc == 1 and out["error"] == "IntegrityError" and "altered" in out["message"], (out, err)
    finally:
        proxy.stop()


def test_signature_globs_match_brackets_literally():
    """docs/distribution.md's example `'gemm[sm_90a](a=bf16*'`: the brackets are the
    signature's own, not an fnmatch character class; * and ? stay wildcards."""
    import fnmatch  # noqa: PLC0415

    from cutlass_aot.remote.pull import _glob  # noqa: PLC0415

    text = "gemm[sm_90a](a=bf16,a_major=k)"
    assert fnmatch.fnmatchcase(text, _glob("gemm[sm_90a](a=bf16*"))
    assert fnmatch.fnmatchcase(text, _glob("gemm[sm_9?a]*"))
    assert not fnmatch.fnmatchcase(text, _glob("gemm[sm_90](a=bf16*"))
    assert not fnmatch.fnmatchcase("gemm[s](x)", _glob("gemm[sm_90a](*"))


# ------------------------------------------- review fixes: auth, time, races
def test_https_never_steps_down_to_http(built_cache, tmp_path):
    """A registry on HTTPS that points a request at plain HTTP on its own host
    (a blob redirect, an upload Location, a token realm): refused, and nothing
    (no credential, no token, no presigned query) goes out in the clear."""
    server = RegistryServer(tmp_path / "reg", user=("ci", "s3cret")).start()
    (tmp_path / "tls").mkdir()
    cert, key = self_signed(tmp_path / "tls")
    mode = {"case": ""}

    def hook(method, path, headers):
        if mode["case"] == "redirect" and method == "GET" and "/blobs/" in path:
            return (307, [("Location", f"http://{front.host}{path}?X-Amz-Signature=SECRETSIG")], b"")
        if mode["case"] == "realm":
            if path.startswith("/token"):
                return (200, [("Content-Type", "application/json")], b'{"token": "tok"}')
            if "Authorization" not in headers:
                return (401, [("WWW-Authenticate", f'Bearer realm="http://{front.host}/token",service="r"')],
                        b"")
        return None

    def post(method, path, answer):
        status, headers, data = answer
        if mode["case"] == "upload" and method == "POST" and "/blobs/uploads/" in path:
            moved = []
            for k, v in headers:
                if k.lower() == "location":
                    tail = v.split("/v2/", 1)[1]
                    v = f"http://{front.host}/v2/{tail}"
                moved.append((k, v))
            return (status, moved, data)
        return None

    front = HookProxy(server.host, hook=hook, post=post, tls=(cert, key))
    env = subprocess_env(CUTLASS_AOT_REGISTRY_USER="ci", CUTLASS_AOT_REGISTRY_PASSWORD="s3cret",
                         CUTLASS_AOT_REGISTRY_HOST=front.host)
    try:
        res = run_cli("push", "--cache-dir", built_cache.path, f"{server.host}/kernels/tiny:v1", "--plain-http",
                      env=env | {"CUTLASS_AOT_REGISTRY_HOST": server.host})
        assert res.returncode == 0, res.stderr
        for case in ("redirect", "upload", "realm"):
            mode["case"] = case
            ref = f"{front.host}/kernels/{'up' if case == 'upload' else 'tiny'}:v1"
            if case == "upload":
                res = run_cli("push", "--cache-dir", built_cache.path, ref, "--ca-file", cert, env=env)
            else:
                res = run_cli("pull", ref, "--cache-dir", tmp_path / case, "--ca-file", cert, env=env)
            assert res.returncode == 1 and "Traceback" not in res.stderr, (case, res.stderr)
            assert "to plain HTTP" in res.stderr and "--plain-http" in res.stderr, (case, res.stderr)
            assert "SECRETSIG" not in res.stderr and "s3cret" not in res.stderr
            assert front.plain_log == [], (case, front.plain_log)
            assert front.log, "the proxy was asked over HTTPS"
    finally:
        front.stop()
        server.stop()


def test_env_credentials_go_only_to_their_host(registry, pushed, tmp_path):
    """CUTLASS_AOT_REGISTRY_USER/PASSWORD go to CUTLASS_AOT_REGISTRY_HOST alone:
    another registry, or a token realm on another host, asking for them gets
    none; the pair without the host is a usage error."""
    ref, _ = pushed
    path = ref.split("/", 1)[1]
    evil = HookProxy(hook=lambda m, p, h: (401, [("WWW-Authenticate", 'Basic realm="x"')], b"")
                     if "Authorization" not in h else (404, [], b""))
    tokens = HookProxy(hook=lambda m, p, h: (200, [("Content-Type", "application/json")], b'{"token": "t"}'))
    realms = {"own": 0}

    def challenge(realm_host):
        def hook(method, p, headers):
            if p.startswith("/token"):  # its own token service
                realms["own"] += headers.get("Authorization", "").startswith("Basic ")
                return (200, [("Content-Type", "application/json")], b'{"token": "t"}')
            if "Authorization" not in headers:
                return (401, [("WWW-Authenticate", f'Bearer realm="http://{realm_host()}/token"')], b"")
            return None
        return hook

    elsewhere = HookProxy(registry.host, hook=challenge(lambda: tokens.host))
    own = HookProxy(registry.host, hook=challenge(lambda: own.host))
    pair = {"CUTLASS_AOT_REGISTRY_USER": "ci", "CUTLASS_AOT_REGISTRY_PASSWORD": "private-token"}
    try:
        res = run_cli("pull", f"{evil.host}/some/public:v1", "--cache-dir", tmp_path / "a", "--plain-http",
                      env=subprocess_env(**pair, CUTLASS_AOT_REGISTRY_HOST=None))
        assert res.returncode == 2 and "CUTLASS_AOT_REGISTRY_HOST" in res.stderr, res.stderr
        assert not evil.log, "nothing is sent before the pair is scoped"
        res = run_cli("pull", f"{evil.host}/some/public:v1", "--cache-dir", tmp_path / "a", "--plain-http",
                      env=subprocess_env(**pair, CUTLASS_AOT_REGISTRY_HOST=registry.host))
        assert res.returncode == 1 and "401" in res.stderr, res.stderr
        assert evil.log and not any("Authorization" in h for _, _, h in evil.log)
        for proxy in (elsewhere, own):
            res = run_cli("pull", f"{proxy.host}/{path}", "--cache-dir", tmp_path / proxy.host.replace(":", "_"),
                          "--plain-http", env=subprocess_env(**pair, CUTLASS_AOT_REGISTRY_HOST=proxy.host))
            assert res.returncode == 0, res.stderr
        assert tokens.log and not any("Authorization" in h for _, _, h in tokens.log)
        assert realms["own"] >= 1, "a realm on the registry's own host gets the pair"
    finally:
        for proxy in (evil, tokens, elsewhere, own):
            proxy.stop()


def test_concurrent_pulls_into_one_cache(built_cache, pushed, tmp_path):
    """Four pulls of one reference into one empty cache at once: each links
    the shared downloads it uses, so none loses a file another one deleted."""
    ref, _ = pushed
    for trial in range(3):
        dst = tmp_path / f"c{trial}"
        procs = [subprocess.Popen(cli_argv("pull", ref, "--cache-dir", dst, "--plain-http"), env=subprocess_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, (trial, err[-1500:])
        assert entries_of(dst) == entries_of(built_cache.path)
        assert_clean(dst)
        assert not list((dst / "tmp").glob("pull-*")), "each pull removes what it owns; the last the rest"


def _drip(chunks, pause: float, limit: float = 20.0):
    """Yield ``chunks`` one by one, ``pause`` seconds apart, for ``limit`` seconds at most."""
    end = time.monotonic() + limit
    for chunk in chunks:
        if time.monotonic() > end:
            return
        yield chunk
        time.sleep(pause)


def test_a_stalled_registry_ends_within_the_deadline(registry, built_cache, pushed, tmp_path):
    """A registry that sends headers and then a byte now and then (each socket
    read succeeds, so the socket timeout never fires) ends the pull within
    CUTLASS_AOT_REGISTRY_TIMEOUT (a blob: plus a second per 256 KiB), with a
    RegistryError; a blob's bytes so far are kept and the next pull resumes."""
    ref, _ = pushed
    path = ref.split("/", 1)[1]
    index = read_index(built_cache.path)
    sha = max(index["entries"].values(), key=lambda r: r["size"])["sha256"]
    blob = registry.blob_file(sha).read_bytes()

    def manifest(method, p, headers):
        if "/manifests/" in p and method == "GET":
            return (200, [("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                          ("Content-Length", "4000000")], _drip([b" "] * 400, 0.2))
        return None

    def blob_drip(method, p, headers):
        if p.endswith(sha) and method == "GET":
            pieces = [blob[i:i + 1024] for i in range(0, len(blob), 1024)]
            return (200, [("Content-Length", str(len(blob)))], _drip(pieces, 0.2))
        return None

    env = subprocess_env(CUTLASS_AOT_REGISTRY_TIMEOUT="2")
    proxies = [HookProxy(registry.host, hook=manifest), HookProxy(registry.host, hook=blob_drip)]
    try:
        t0 = time.monotonic()
        res = run_cli("pull", f"{proxies[0].host}/{path}", "--cache-dir", tmp_path / "m", "--plain-http", env=env)
        assert res.returncode == 1 and "did not finish within 2 s" in res.stderr, res.stderr
        assert "CUTLASS_AOT_REGISTRY_TIMEOUT" in res.stderr and "Traceback" not in res.stderr
        assert time.monotonic() - t0 < 15
        dst = tmp_path / "b"
        t0 = time.monotonic()
        res = run_cli("pull", f"{proxies[1].host}/{path}", "--cache-dir", dst, "--plain-http", env=env)
        assert res.returncode == 1 and "took longer than" in res.stderr and "resumes" in res.stderr, res.stderr
        assert time.monotonic() - t0 < 15
        part = dst / "tmp" / f"pull-{sha}.part"
        assert 0 < part.stat().st_size < len(blob)
        assert not (dst / "index.json").exists()
        rc, out, err = run_cli_json("pull", ref, "--cache-dir", dst, "--plain-http", env=env)
        assert rc == 0, (out, err)
        assert entries_of(dst) == entries_of(built_cache.path)
        assert_clean(dst)
        res = run_cli("pull", ref, "--cache-dir", dst, "--plain-http",
                      env=subprocess_env(CUTLASS_AOT_REGISTRY_TIMEOUT="soon"))
        assert res.returncode == 2 and "CUTLASS_AOT_REGISTRY_TIMEOUT" in res.stderr, res.stderr
    finally:
        for proxy in proxies:
            proxy.stop()


def test_a_config_past_the_cap_is_refused_unread(registry, built_cache, pushed, tmp_path, monkeypatch):
    """bundle.MAX_CONFIG bounds what a pull parses (json.loads takes ~27x a
    document's size): a manifest announcing a larger config is refused before
    the config is fetched, and push refuses to write one."""
    from cutlass_aot.remote import bundle  # noqa: PLC0415
    from cutlass_aot.remote.push import push  # noqa: PLC0415

    ref, _ = pushed
    path = ref.split("/", 1)[1]
    big = bundle.MAX_CONFIG + 1
    assert big <= (64 << 20), "a pull must not parse hundreds of MiB of JSON"

    def manifest(method, p, headers):
        if "/manifests/" in p and method == "GET":
            doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": [],
                   "config": {"mediaType": bundle.CONFIG_TYPE, "digest": "sha256:" + "a" * 64, "size": big}}
            return (200, [("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
                    json.dumps(doc).encode())
        return None

    proxy = HookProxy(registry.host, hook=manifest)
    try:
        res = run_cli("pull", f"{proxy.host}/{path}", "--cache-dir", tmp_path / "dst", "--plain-http")
        assert res.returncode == 1 and f"1..{bundle.MAX_CONFIG} bytes" in res.stderr, res.stderr
        assert not any("/blobs/" in p for _, p, _ in proxy.log), "the config was fetched"
        proxy.log.clear()
        monkeypatch.setattr(bundle, "MAX_CONFIG", 1000)  # the test cache's config is larger than this
        with pytest.raises(UsageError, match="several references"):
            push(built_cache.path, f"{proxy.host}/kernels/big:v1", plain_http=True)
        assert not proxy.log, "nothing is uploaded for a config no pull would read"
    finally:
        proxy.stop()


def test_malformed_redirect_or_realm_urls_are_registry_errors(registry, pushed, tmp_path):
    """A redirect Location or a bearer realm that does not parse as a URL (bad
    IPv6 brackets, a port past 65535): a RegistryError that does not repeat
    the URL, not a ValueError traceback."""
    ref, _ = pushed
    path = ref.split("/", 1)[1]

    def redirect(location):
        return lambda m, p, h: (307, [("Location", location)], b"") if "/blobs/" in p and m == "GET" else None

    def realm(url):
        return lambda m, p, h: (401, [("WWW-Authenticate", f'Bearer realm="{url}"')], b"") \
            if "Authorization" not in h else None

    cases = [(redirect("http://[::1/x?X-Amz-Signature=SECRETSIG"), "malformed redirect URL"),
             (redirect("http://127.0.0.1:99999/x?X-Amz-Signature=SECRETSIG"), "malformed redirect URL"),
             (realm("http://[::1/token?sig=SECRETSIG"), "malformed token realm URL"),
             (realm("http://127.0.0.1:99999/token?sig=SECRETSIG"), "malformed token realm URL")]
    for n, (hook, message) in enumerate(cases):
        proxy = HookProxy(registry.host, hook=hook)
        try:
            res = run_cli("pull", f"{proxy.host}/{path}", "--cache-dir", tmp_path / f"d{n}", "--plain-http")
        finally:
            proxy.stop()
        assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr, (n, res.stderr)
        assert "SECRETSIG" not in res.stderr


def test_push_refuses_a_reference_with_a_digest(registry, built_cache, pushed):
    """`push host/repo:tag@sha256:...` used to report success and set no tag:
    push takes a tag; the digest is what it produces."""
    ref, out = pushed
    proxy = HookProxy(registry.host)
    try:
        target = f"{proxy.host}/kernels/tiny:v9@{out['digest']}"
        res = run_cli("push", "--cache-dir", built_cache.path, target, "--plain-http")
        assert res.returncode == 2 and "push takes a tag" in res.stderr, res.stderr
        assert f"{proxy.host}/kernels/tiny:v9 " in res.stderr and not proxy.log
    finally:
        proxy.stop()


def test_busy_registries_are_retried_a_bounded_number_of_times(registry, built_cache, pushed, tmp_path):
    """429/502/503/504 on an idempotent request: sent again after Retry-After
    (or a back-off), at most RETRIES times; then a RegistryError that says so."""
    ref, _ = pushed
    path = ref.split("/", 1)[1]
    seen = {"head": 0, "blob": 0}

    def once(method, p, headers):
        if method == "HEAD" and not seen["head"]:
            seen["head"] += 1
            return (503, [], b"")
        if method == "GET" and "/blobs/sha256:" in p and not seen["blob"]:
            seen["blob"] += 1
            return (429, [("Retry-After", "1"), ("Content-Type", "application/json")],
                    b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}')
        return None

    always = lambda m, p, h: (503, [("Retry-After", "0")], b"busy") if "/manifests/" in p else None  # noqa: E731
    flaky, down = HookProxy(registry.host, hook=once), HookProxy(registry.host, hook=always)
    try:
        res = run_cli("push", "--cache-dir", built_cache.path, f"{flaky.host}/kernels/tiny:v2", "--plain-http")
        assert res.returncode == 0 and seen["head"] == 1, res.stderr
        res = run_cli("pull", f"{flaky.host}/{path}", "--cache-dir", tmp_path / "a", "--plain-http")
        assert res.returncode == 0 and seen["blob"] == 1, res.stderr
        assert_clean(tmp_path / "a")
        from cutlass_aot.remote.client import RETRIES  # noqa: PLC0415

        res = run_cli("pull", f"{down.host}/{path}", "--cache-dir", tmp_path / "b", "--plain-http")
        assert res.returncode == 1 and f"after {RETRIES} retries" in res.stderr, res.stderr
        assert sum("/manifests/" in p for _, p, _ in down.log) == RETRIES + 1
    finally:
        flaky.stop()
        down.stop()
