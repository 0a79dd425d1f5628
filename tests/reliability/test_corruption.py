"""Corrupted caches: every kind of damage is detected by `verify`, refused by
the loader before dlopen, and repaired by the next build.

Artifact damage: truncated (half, to zero), a flipped bit, a byte appended,
two entries' artifacts swapped, replaced by random bytes, and replaced by a
different, valid shared library whose constructor would leave a marker file
if it were ever loaded. Each round corrupts every entry of a copy of the
session cache (so one rebuild repairs several), one untouched entry serving
as a control where a round has a spare.

Index damage (truncated, garbage, empty, a malformed record): detected by
`verify` and refused at open; whether the next build rewrites it is a
separate, currently failing test (see its BUG reason).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from cutlass_aot.errors import IntegrityError
from cutlass_aot.layout import read_index
from cutlass_aot.run.load import Cache
from tests.support import (
    artifact,
    copy_cache,
    edit_index,
    make_tree_writable,
    mapped_files,
    record,
    run_cli_json,
    scaled,
    truncate,
)

SEED = 424242


@pytest.fixture(scope="module")
def evil_so(tmp_path_factory) -> tuple[Path, Path]:
    """A valid ELF shared library that touches a marker file when loaded."""
    d = tmp_path_factory.mktemp("evil")
    marker = d / "LOADED"
    src = d / "evil.c"
    src.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void pwn(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\nint gemm(void) { return 0; }\n"
    )
    lib = d / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib, marker


def _damage(kind: str, cache: Path, keys: list[str], rng: random.Random, evil: Path) -> None:
    libs = [artifact(cache, k) for k in keys]
    if kind == "truncate-half":
        truncate(libs[0])
    elif kind == "truncate-zero":
        truncate(libs[0], 0)
    elif kind == "bit-flip":
        data = bytearray(libs[0].read_bytes())
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        libs[0].write_bytes(bytes(data))
    elif kind == "append-byte":
        with open(libs[0], "ab") as f:
            f.write(b"\x00")
    elif kind == "swap":
        tmp = libs[0].with_name("swap.tmp")
        os.rename(libs[0], tmp)
        os.rename(libs[1], libs[0])
        os.rename(tmp, libs[1])
    elif kind == "random-bytes":
        libs[0].write_bytes(rng.randbytes(libs[0].stat().st_size))
    elif kind == "other-valid-so":
        shutil.copyfile(evil, libs[0])
    else:
        raise ValueError(kind)


WIDTH = {"swap": 2}
ROUNDS = [
    ["truncate-half", "bit-flip", "other-valid-so"],
    ["swap", "truncate-zero"],
    ["random-bytes", "append-byte"],  # the third entry stays intact: a control
]


@pytest.mark.slow
def test_artifact_corruption_detected_refused_repaired(built_cache, tmp_path, evil_so, load_spy):
    evil, marker = evil_so
    rng = random.Random(SEED)
    rounds = [list(r) for _ in range(scaled(1)) for r in ROUNDS]
    trials, lost, notes = 0, 0, []
    for n, kinds in enumerate(rounds):
        cache = copy_cache(built_cache.path, tmp_path / f"cache-{n}")
        keys = list(built_cache.keys)
        rng.shuffle(keys)
        damaged: dict[str, list[str]] = {}
        for kind in kinds:
            take, keys = keys[:WIDTH.get(kind, 1)], keys[WIDTH.get(kind, 1):]
            _damage(kind, cache, take, rng, evil)
            damaged[kind] = take
        intact = keys
        bad_keys = {k for ks in damaged.values() for k in ks}

        rc, out, _ = run_cli_json("verify", "--cache-dir", cache)
        flagged = {p["what"] for p in out["problems"]}
        loader = Cache(cache)
        refused, leaked = set(), set()
        for key in bad_keys:
            before = len(load_spy.calls)
            try:
                loader.function(key)
            except IntegrityError:
                refused.add(key)
            if len(load_spy.calls) != before or str(artifact(cache, key).resolve()) in mapped_files():
                leaked.add(key)
        for key in intact:  # the control entry still serves (and the spy sees it)
            before = len(load_spy.calls)
            loader.function(key)
            if len(load_spy.calls) != before + 1:
                notes.append(f"round {n}: the load spy missed a load")
                lost += 1

        rc_build, rep, err = run_cli_json("build", built_cache.manifest, "--cache-dir", cache, "-j", "2")
        rc_after, after, _ = run_cli_json("verify", "--cache-dir", cache)
        repaired_loader = Cache(cache)
        reloaded = set()
        for key in bad_keys:
            try:
                repaired_loader.function(key)
                reloaded.add(key)
            except Exception as exc:  # noqa: BLE001 - tallied as a loss below
                notes.append(f"round {n}: rebuilt {key[:12]} does not load: {exc}")

        for kind, ks in damaged.items():
            trials += 1
            problems = []
            if rc != 1 or not set(ks) <= flagged:
                problems.append("not detected by verify")
            if not set(ks) <= refused or set(ks) & leaked:
                problems.append("not refused before dlopen")
            if rc_build != 0 or not set(ks) <= reloaded or rc_after != 0:
                problems.append(f"not repaired (build rc {rc_build}, verify rc {rc_after})")
            if problems:
                lost += 1
                notes.append(f"round {n} {kind}: {', '.join(problems)}")
        if rep.get("built") != len(bad_keys) or rep.get("cached") != len(intact):
            notes.append(f"round {n}: rebuild compiled {rep.get('built')} for {len(bad_keys)} damaged")
            lost += 1
        make_tree_writable(cache)
        shutil.rmtree(cache)

    if marker.exists():
        lost += 1
        notes.append("the planted library's constructor ran: it was dlopened")
    record("artifact corruption (7 kinds): verify/refuse/rebuild", trials, lost, notes)
    assert lost == 0, notes


INDEX_DAMAGE = ["truncate", "garbage", "empty", "malformed-record", "path-escape"]


def _damage_index(kind: str, cache: Path, rng: random.Random) -> None:
    path = cache / "index.json"
    if kind == "truncate":
        truncate(path, rng.randrange(1, path.stat().st_size))
    elif kind == "garbage":
        path.write_bytes(rng.randbytes(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "malformed-record":
        edit_index(cache, lambda d: next(iter(d["entries"].values())).pop("sha256"))
    elif kind == "path-escape":  # valid index whose record points outside; verify must flag it
        edit_index(cache, lambda d: next(iter(d["entries"].values())).update(path="../../x.so"))
    else:
        raise ValueError(kind)


@pytest.mark.slow
def test_index_corruption_detected_and_refused(built_cache, tmp_path):
    rng = random.Random(SEED)
    trials, lost, notes = 0, 0, []
    for n in range(scaled(1)):
        for kind in INDEX_DAMAGE:
            trials += 1
            cache = copy_cache(built_cache.path, tmp_path / f"idx-{n}-{kind}")
            _damage_index(kind, cache, rng)
            rc, out, _ = run_cli_json("verify", "--cache-dir", cache)
            problems = []
            if rc != 1 or not out["problems"]:
                problems.append(f"verify rc {rc}: {out}")
            try:
                loader = Cache(cache)
                if kind != "path-escape":
                    problems.append("loader opened it")
                else:
                    key = next(iter(loader.entries))
                    try:
                        loader.function(key)
                        problems.append("loader loaded an escaping path")
                    except IntegrityError:
                        pass
            except IntegrityError:
                pass
            except Exception as exc:  # noqa: BLE001 - tallied as a loss
                problems.append(f"loader raised {type(exc).__name__}: {exc}")
            if problems:
                lost += 1
                notes.append(f"{kind}: {'; '.join(problems)}")
            make_tree_writable(cache)
            shutil.rmtree(cache)
    record("index corruption: detected by verify, refused at open", trials, lost, notes)
    assert lost == 0, notes


@pytest.mark.slow
def test_index_corruption_repaired_by_next_build(built_cache, tmp_path):
    rng = random.Random(SEED)
    trials, lost, notes = 0, 0, []
    for n in range(scaled(1)):
        for kind in ["truncate", "garbage", "empty", "malformed-record"]:
            trials += 1
            cache = copy_cache(built_cache.path, tmp_path / f"idx-{n}-{kind}")
            _damage_index(kind, cache, rng)
            rc, rep, err = run_cli_json("build", built_cache.manifest, "--cache-dir", cache)
            problems = []
            if rc != 0 or rep["built"] != 0:
                problems.append(f"build rc {rc}, compiled {rep.get('built')}")
            try:
                if set(read_index(cache, missing_ok=False)["entries"]) != set(built_cache.keys):
                    problems.append("index lacks entries")
                Cache(cache)
            except Exception as exc:  # noqa: BLE001 - tallied as a loss
                problems.append(f"index still damaged: {type(exc).__name__}")
            if problems:
                lost += 1
                notes.append(f"{kind}: {'; '.join(problems)}")
            make_tree_writable(cache)
            shutil.rmtree(cache)
    record("index corruption: repaired by next build", trials, lost, notes)
    assert lost == 0, notes
