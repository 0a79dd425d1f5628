"""Sharded builds and merging shard caches (real plans, real compiles).

The split is checked on the shipped manifests' real plan (132 keys, no
compile). Shard builds of the tiny manifest are real builds; their merge must
equal the session's single build key for key and byte for byte.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from cutlass_aot.builder.manifest import load_manifests
from cutlass_aot.builder.plan import Shard, assign_shards, plan, shard_jobs
from cutlass_aot.builder.store import CacheStore
from cutlass_aot.errors import UsageError
from cutlass_aot.layout import read_index
from tests.support import REPO, cli_argv, edit_index, flip_byte, run_cli, run_cli_json, subprocess_env

SHIPPED = sorted(str(p) for p in (REPO / "configs").glob("*.yaml"))


def files_of(cache: Path) -> dict[str, bytes]:
    """Every artifact and runtime library, by index path, with its bytes' digest."""
    index = read_index(cache)
    out = {}
    for key, rec in index["entries"].items():
        out[key] = (cache / rec["path"]).read_bytes()
    for sha, rec in index["runtimes"].items():
        if rec.get("path"):
            out[f"runtime {sha}"] = (cache / rec["path"]).read_bytes()
    return out


# ------------------------------------------------------------------ split
@pytest.fixture(scope="module")
def shipped_jobs():
    return plan(load_manifests(SHIPPED))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_shards_are_disjoint_cover_all_and_balanced(shipped_jobs, count):
    slices = assign_shards(shipped_jobs, count)
    keys = [j.key for s in slices for j in s]
    assert len(keys) == len(set(keys)) == len(shipped_jobs)
    sizes = [len(s) for s in slices]
    assert max(sizes) - min(sizes) <= 1, sizes  # equal expected costs: balanced by count
    for i in range(1, count + 1):
        mine, report = shard_jobs(shipped_jobs, Shard(i, count))
        assert [j.key for j in mine] == [j.key for j in shipped_jobs if j.key in {x.key for x in slices[i - 1]}]
        assert report["keys"] == len(mine) and report["planned"] == len(shipped_jobs)


def test_split_ignores_manifest_order_and_duplicates(tmp_path):
    text = Path(SHIPPED[0]).read_text()
    head, _, rest = text.partition("kernels:\n")
    blocks = ["  - " + b for b in rest.split("  - ")[1:]]
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(head + "kernels:\n" + "".join(blocks))
    b.write_text(head + "kernels:\n" + "".join(reversed(blocks)))
    one = assign_shards(plan(load_manifests([str(a)])), 4)
    two = assign_shards(plan(load_manifests([str(b), str(a)])), 4)
    assert [[j.key for j in s] for s in one] == [[j.key for j in s] for s in two]


def test_shard_flag_is_validated_and_reported(tiny_manifest, tmp_path):
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(UsageError):
            Shard.parse(bad)
        res = run_cli("build", tiny_manifest, "--cache-dir", tmp_path / "c", "--shard", bad)
        assert res.returncode == 2 and "--shard" in res.stderr
    assert not (tmp_path / "c").exists()


# -------------------------------------------------------- shard builds, merge
@pytest.fixture(scope="module")
def shard_caches(tiny_manifest, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    out = []
    for i in (1, 2):
        rc, data, err = run_cli_json("build", tiny_manifest, "--cache-dir", root / f"s{i}", "--shard", f"{i}/2",
                                     "-j", "2")
        assert rc == 0, err
        assert data["shard"]["index"] == i and data["shard"]["count"] == 2
        out.append((root / f"s{i}", data))
    return out


def test_merged_shards_equal_the_single_build(built_cache, shard_caches, tmp_path):
    (s1, d1), (s2, d2) = shard_caches
    assert d1["shard"]["keys"] + d2["shard"]["keys"] == len(built_cache.keys)
    assert not set(read_index(s1)["entries"]) & set(read_index(s2)["entries"])
    dst = tmp_path / "merged"
    rc, out, err = run_cli_json("merge", s1, s2, "--cache-dir", dst)
    assert rc == 0 and out["ok"] and out["added"] == len(built_cache.keys), (out, err)
    assert files_of(dst) == files_of(built_cache.path)  # key for key, byte for byte
    for key in built_cache.keys:  # records travel verbatim
        assert (dst / "entries" / key / "entry.json").read_bytes() in (
            (s / "entries" / key / "entry.json").read_bytes() for s in (s1, s2) if (s / "entries" / key).exists())
    assert run_cli("verify", "--cache-dir", dst).returncode == 0
    rc, again, _ = run_cli_json("merge", s1, s2, "--cache-dir", dst)
    assert rc == 0 and again["added"] == 0 and again["present"] == len(built_cache.keys)


def test_merge_refuses_corrupt_entries(shard_caches, tmp_path):
    (s1, _), (s2, _) = shard_caches
    bad = shutil.copytree(s1, tmp_path / "bad")
    keys = sorted(read_index(bad)["entries"])
    flip_byte(bad / "entries" / keys[0] / "kernel.so")
    dst = tmp_path / "dst"
    rc, out, err = run_cli_json("merge", bad, s2, "--cache-dir", dst)
    assert rc == 1 and not out["ok"]
    assert [c["key"] for c in out["corrupt"]] == [keys[0]]
    assert keys[0] not in read_index(dst)["entries"]
    assert len(read_index(dst)["entries"]) == out["added"] == len(keys) - 1 + len(read_index(s2)["entries"])
    # a record moved to another key (its key_inputs no longer hash to it) is corrupt too
    forged = shutil.copytree(s2, tmp_path / "forged")
    key = sorted(read_index(forged)["entries"])[0]
    rec_path = forged / "entries" / key / "entry.json"
    rec = json.loads(rec_path.read_text())
    rec["key_inputs"]["params"]["tile"] = "64x128"
    rec_path.write_text(json.dumps(rec, indent=1, sort_keys=True))
    rc, out, _ = run_cli_json("merge", forged, "--cache-dir", tmp_path / "dst2")
    assert rc == 1 and "key_inputs" in out["corrupt"][0]["problem"]


def test_merge_refuses_conflicts(shard_caches, tmp_path):
    """One key, two different artifacts (a build that is not reproducible): neither is taken."""
    (s1, _), _ = shard_caches
    other = shutil.copytree(s1, tmp_path / "other")
    key = sorted(read_index(other)["entries"])[0]
    lib = other / "entries" / key / "kernel.so"
    flip_byte(lib)
    import hashlib  # noqa: PLC0415

    sha = hashlib.sha256(lib.read_bytes()).hexdigest()
    rec_path = other / "entries" / key / "entry.json"
    rec = json.loads(rec_path.read_text())
    rec["sha256"] = sha
    rec_path.write_text(json.dumps(rec, indent=1, sort_keys=True))
    edit_index(other, lambda idx: idx["entries"][key].update(sha256=sha))
    dst = tmp_path / "dst"
    rc, out, err = run_cli_json("merge", s1, other, "--cache-dir", dst)
    assert rc == 1 and [c["key"] for c in out["conflicts"]] == [key], (out, err)
    assert key not in read_index(dst)["entries"]
    # and against the destination: dst holds s1's artifact, other's differs
    rc, out, _ = run_cli_json("merge", s1, "--cache-dir", tmp_path / "dst2")
    assert rc == 0
    rc, out, _ = run_cli_json("merge", other, "--cache-dir", tmp_path / "dst2")
    assert rc == 1 and [c["key"] for c in out["conflicts"]] == [key]
    assert read_index(tmp_path / "dst2")["entries"][key]["sha256"] != sha


def test_merge_bad_input(shard_caches, tmp_path):
    (s1, _), _ = shard_caches
    res = run_cli("merge", tmp_path / "nope", "--cache-dir", tmp_path / "dst")
    assert res.returncode == 2 and "not a cutlass-aot cache" in res.stderr
    res = run_cli("merge", s1, "--cache-dir", s1)
    assert res.returncode == 2


def test_merges_and_readers_run_concurrently(shard_caches, tmp_path):
    """Two merge processes into one cache while a reader re-reads it: the
    reader only ever sees verified entries, and the result is the union."""
    (s1, _), (s2, _) = shard_caches
    dst = tmp_path / "dst"
    union = set(read_index(s1)["entries"]) | set(read_index(s2)["entries"])
    stop, seen, errors = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            try:
                if (dst / "index.json").exists():
                    index = read_index(dst)
                    seen.append(len(index["entries"]))
                    for rec in index["entries"].values():
                        assert (dst / rec["path"]).stat().st_size == rec["size"]
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    t = threading.Thread(target=reader)
    t.start()
    procs = [subprocess.Popen(cli_argv("merge", a, b, "--cache-dir", dst), env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for a, b in ((s1, s2), (s2, s1), (s1, s2))]
    codes = [p.wait(timeout=300) for p in procs]
    stop.set()
    t.join()
    assert codes == [0, 0, 0], [p.stderr.read() for p in procs]
    assert not errors, errors[:3]
    assert set(read_index(dst)["entries"]) == union
    assert not CacheStore(dst).verify()["problems"]
    assert set(seen) <= {0, len(read_index(s1)["entries"]), len(read_index(s2)["entries"]), len(union)}
