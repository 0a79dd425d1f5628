"""`gc` and `verify --repair` running in loops while 4 builders build.

Each round starts from a copy of the built session cache with one entry's
artifact corrupted, so the builders must rebuild it (and one builder's
manifest adds a key the cache lacks). At the same time one process runs
`gc` (keeping only the tiny manifest's keys) and another `verify --repair`,
each over and over until the builders are done. Afterwards: every builder
succeeded; the cache verifies; every key the index lists has its artifact;
every key of the tiny manifest is listed (gc must keep them; verify may drop
only the corrupt one, which the builders rebuild).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.plan import plan
from cutlass_aot.layout import read_index
from tests.reliability.test_concurrency import OVERLAP_MANIFEST
from tests.support import (
    REPO,
    artifact,
    cli_argv,
    copy_cache,
    flip_byte,
    knob,
    make_tree_writable,
    record,
    run_cli_json,
    scaled,
    subprocess_env,
)

BUILDERS = 4

# Runs gc or verify --repair in a loop until the stop file appears; prints
# how many passes it made.
LOOP = """
import os, sys, time
from pathlib import Path
from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.plan import plan
from cutlass_aot.builder.store import CacheStore
what, cache, stop, manifest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
keep = {j.key for j in plan([load_manifest(manifest)])}
store, passes = CacheStore(cache), 0
while not stop.exists():
    if what == "gc":
        store.gc(keep=keep, older_than_s=None)
    else:
        store.verify(repair=True)
    passes += 1
    time.sleep(0.02)
print(passes)
"""


@pytest.mark.slow
def test_gc_and_verify_repair_against_concurrent_builders(built_cache, tmp_path):
    tiny, overlap = built_cache.manifest, tmp_path / "overlap.yaml"
    overlap.write_text(OVERLAP_MANIFEST)
    tiny_keys = {j.key for j in plan([load_manifest(tiny)])}
    rounds = knob("ROUNDS", scaled(1))
    lost_rounds, notes, passes = 0, [], {"gc": 0, "verify": 0}
    for r in range(rounds):
        cache = copy_cache(built_cache.path, tmp_path / f"cache-{r}")
        corrupt = sorted(tiny_keys)[r % len(tiny_keys)]
        flip_byte(artifact(cache, corrupt))
        stop = tmp_path / f"stop-{r}"
        env = subprocess_env(CUTLASS_AOT_LOCK_TIMEOUT="600")
        loops = {
            what: subprocess.Popen([sys.executable, "-c", LOOP, what, str(cache), str(stop), str(tiny)],
                                   cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
            for what in ("gc", "verify")
        }
        manifests = [tiny, tiny, tiny, overlap][:BUILDERS]
        builders = [
            subprocess.Popen(cli_argv("build", m, "--cache-dir", cache, "-j", "1", "--json"),
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for m in manifests
        ]
        problems = []
        for p in builders:
            out, err = p.communicate(timeout=900)
            try:
                rep = json.loads(out)
            except json.JSONDecodeError:
                problems.append(f"builder output unparsable (rc {p.returncode}): {err[-300:]}")
                continue
            if p.returncode != 0 or rep["failed"]:
                problems.append(f"builder exited {p.returncode}: {rep['failures']}")
        stop.touch()
        for what, p in loops.items():
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                problems.append(f"{what} loop exited {p.returncode}: {err[-500:]}")
            else:
                passes[what] += int(out.strip() or 0)
        index = read_index(cache)
        missing = sorted(k[:12] for k in index["entries"] if not artifact(cache, k).is_file())
        if missing:
            problems.append(f"index lists entries whose artifact is gone: {missing}")
        lost = sorted(k[:12] for k in tiny_keys - set(index["entries"]))
        if lost:
            problems.append(f"tiny-manifest keys not listed: {lost}")
        rc, verify, _ = run_cli_json("verify", "--cache-dir", cache)
        if rc != 0:
            problems.append(f"verify: {verify['problems']}")
        if problems:
            lost_rounds += 1
            notes += [f"round {r}: {p}" for p in problems]
        make_tree_writable(cache)
        subprocess.run(["rm", "-rf", str(cache)], check=False)

    notes.append(f"{passes['gc']} gc and {passes['verify']} verify --repair passes ran during the builds")
    record(f"gc + verify --repair during {BUILDERS} concurrent builds", rounds, lost_rounds, notes)
    assert lost_rounds == 0, notes
