"""Several `cutlass-aot build` processes on one cache at once.

Each round starts N build processes together on a fresh cache: some with the
same manifest, one with a manifest that overlaps it (one shared variant, one
new). Afterwards every process succeeded, the cache verifies, the index holds
exactly the distinct keys, and each key was compiled exactly once: the sum of
the processes' --json ``built`` counts equals the number of distinct keys.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.plan import plan
from tests.support import (
    REPO,
    TINY_MANIFEST,
    cli_argv,
    knob,
    load_index_json,
    record,
    run_cli_json,
    scaled,
    subprocess_env,
)

OVERLAP_MANIFEST = """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      b_major: k
      tile: [128x128, 64x128]
"""


@pytest.mark.slow
def test_concurrent_builds_compile_each_key_once(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_MANIFEST)
    overlap = tmp_path / "overlap.yaml"
    overlap.write_text(OVERLAP_MANIFEST)
    keys = {j.key for j in plan([load_manifest(tiny), load_manifest(overlap)])}
    assert len(keys) == 4  # three from tiny, one new in overlap

    # CI default is small; the recorded run sets 8 builders x 20 rounds.
    rounds = knob("ROUNDS", scaled(1))
    procs_per_round = knob("BUILDERS", scaled(3, minimum=2))
    lost_rounds, notes = 0, []
    for r in range(rounds):
        cache = tmp_path / f"cache-{r}"
        manifests = [tiny if i % 3 != 2 else overlap for i in range(procs_per_round - 1)] + [overlap]
        env = subprocess_env(CUTLASS_AOT_LOCK_TIMEOUT="600")
        procs = [
            subprocess.Popen(cli_argv("build", m, "--cache-dir", cache, "-j", "1", "--json"),
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for m in manifests
        ]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=900)
            results.append((p.returncode, out, err))

        problems = []
        reports = []
        for rc, out, err in results:
            try:
                rep = json.loads(out)
            except json.JSONDecodeError:
                problems.append(f"unparsable output (rc {rc}): {err[-500:]}")
                continue
            reports.append(rep)
            if rc != 0 or rep["failed"]:
                problems.append(f"build exited {rc}: {rep['failures']}")
            if rep["built"] + rep["cached"] != rep["total"]:
                problems.append(f"built {rep['built']} + cached {rep['cached']} != total {rep['total']}")
        compiled = sum(rep["built"] for rep in reports)
        if compiled != len(keys):
            problems.append(f"{compiled} compiles for {len(keys)} distinct keys")
        indexed = set(load_index_json(cache)["entries"])
        if indexed != keys:
            problems.append(f"index holds {len(indexed)} keys, {len(indexed & keys)} of the expected")
        rc, verify, _ = run_cli_json("verify", "--cache-dir", cache)
        if rc != 0:
            problems.append(f"verify: {verify['problems']}")
        leftovers = sorted(p.name for p in (cache / "tmp").iterdir())
        if leftovers:
            problems.append(f"tmp/ leftovers: {leftovers}")
        if problems:
            lost_rounds += 1
            notes += [f"round {r}: {p}" for p in problems]

    record(f"concurrent builds ({procs_per_round} procs, same+overlapping manifests)",
           rounds, lost_rounds, notes)
    assert lost_rounds == 0, notes
