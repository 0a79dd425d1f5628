"""Push/pull figures against a real registry (Debian's docker-registry).

Starts the registry on 127.0.0.1 (storage in --work), then, every step a real
`cutlass-aot` subprocess:

1. push the cache (bytes, seconds); push again (0 blobs uploaded);
2. pull --arch sm_90a into an empty dir, `verify` it, compare with the source;
3. kill -9 a pull at --kills random moments (uniform over one pull's wall
   time): after each kill a reader sees no index, or an index listing none or
   all of the entries, every one verified; then one more pull completes;
4. the registry killed mid-pull (a relay cuts it after 8 MB): exit 1, nothing
   visible; after a restart the pull resumes and completes;
5. one blob tampered in the registry's storage: exit 1, nothing published.

Writes benchmarks/results/<date>_push_pull.md.

    python benchmarks/bench_remote.py --cache /path/to/built/cache [--kills 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import header, write  # noqa: E402

from cutlass_aot.builder.store import CacheStore  # noqa: E402
from cutlass_aot.layout import read_index  # noqa: E402
from tests.registry import CuttingProxy, RegistryServer  # noqa: E402


def cli(*args, json_out: bool = True) -> tuple[int, dict | str, str, float]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "cutlass_aot.cli", *map(str, args),
                          *(["--json"] if json_out else [])], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    out: dict | str = res.stdout
    if json_out:
        try:
            out = json.loads(res.stdout)
        except ValueError:
            pass
    return res.returncode, out, res.stderr, wall


def entries(cache: Path) -> dict[str, str]:
    return {k: r["sha256"] for k, r in read_index(cache)["entries"].items()}


def visible(cache: Path, full: dict) -> str:
    """What a reader sees; raises if it is partial or unverified."""
    if not (cache / "index.json").exists():
        return "no index"
    seen = set(read_index(cache)["entries"])
    if seen not in (set(), set(full)):
        raise SystemExit(f"PARTIAL: a reader sees {len(seen)} of {len(full)} entries")
    problems = CacheStore(cache).verify()["problems"]
    if problems:
        raise SystemExit(f"UNVERIFIED after kill: {problems[:3]}")
    return f"{len(seen)} entries"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cache", required=True, help="a built cache (e.g. the shipped configs/)")
    ap.add_argument("--work", default="/tmp/cutlass-aot-remote")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache, work = Path(args.cache), Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src_index = read_index(cache)
    sm90 = {k: r["sha256"] for k, r in src_index["entries"].items() if r["signature"]["arch"] == "sm_90a"}
    server = RegistryServer(work / "registry").start()
    ref = f"{server.host}/cutlass-aot/kernels:bench"
    lines: list[str] = []
    try:
        rc, p1, err, w1 = cli("push", "--cache-dir", cache, ref, "--plain-http")
        assert rc == 0, err
        rc, p2, err, w2 = cli("push", "--cache-dir", cache, ref, "--plain-http")
        assert rc == 0 and p2["blobs_transferred"] == 0, (p2, err)
        lines += [
            "## Push\n",
            "| run | blobs in manifest | blobs uploaded | bytes uploaded | push s (library) | process wall s |",
            "|---|---|---|---|---|---|",
            f"| first push | {p1['blobs']} | {p1['blobs_transferred']} | {p1['bytes']} | {p1['seconds']} | {w1:.2f} |",
            f"| second push | {p2['blobs']} | {p2['blobs_transferred']} | {p2['bytes']} | {p2['seconds']} | {w2:.2f} |",
            "",
        ]
        dst = work / "pulled"
        rc, q, err, wq = cli("pull", ref, "--cache-dir", dst, "--plain-http", "--arch", "sm_90a")
        assert rc == 0, err
        vrc, vout, _, _ = cli("verify", "--cache-dir", dst)
        same = entries(dst) == sm90 and all(
            (dst / "entries" / k / "kernel.so").read_bytes() == (cache / "entries" / k / "kernel.so").read_bytes()
            for k in sm90)
        lines += [
            "## Pull --arch sm_90a into an empty directory\n",
            "| entries | blobs downloaded | bytes | pull s (library) | process wall s | verify | same keys and bytes as the source |",
            "|---|---|---|---|---|---|---|",
            f"| {q['entries']} | {q['blobs_transferred']} | {q['bytes']} | {q['seconds']} | {wq:.2f} | "
            f"{'clean' if vrc == 0 and vout['ok'] else vout} | {same} |",
            "",
        ]
        # ---- kill -9 campaign
        probe = work / "probe"
        t0 = time.perf_counter()
        rc, _, err, _ = cli("pull", ref, "--cache-dir", probe, "--plain-http", "--arch", "sm_90a")
        span = time.perf_counter() - t0
        rng = random.Random(args.seed)
        target = work / "killed"
        rows = []
        for i in range(args.kills):
            fresh = (target / "index.json").exists() and set(entries(target)) == set(sm90)
            if fresh:  # the last pull got to its commit: start over so this kill hits real work
                shutil.rmtree(target, ignore_errors=True)
            delay = rng.uniform(0, span)
            proc = subprocess.Popen([sys.executable, "-m", "cutlass_aot.cli", "pull", ref, "--cache-dir",
                                     str(target), "--plain-http", "--arch", "sm_90a"], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            code = proc.wait()
            tmp = target / "tmp"
            parts = sum(p.stat().st_size for p in tmp.glob("pull-*.part")) if tmp.is_dir() else 0
            blobs = len(list(tmp.glob("pull-*.blob"))) if tmp.is_dir() else 0
            rows.append(f"| {i + 1} | {'empty dir' if fresh else 'resume'} | {delay * 1000:.0f} | "
                        f"{'killed' if code == -9 else f'exit {code}'} | "
                        f"{visible(target, sm90)} | {blobs} | {parts} |")
        rc, last, err, _ = cli("pull", ref, "--cache-dir", target, "--plain-http", "--arch", "sm_90a")
        vrc, vout, _, _ = cli("verify", "--cache-dir", target)
        lines += [
            f"## kill -9 during pull, {args.kills} random moments\n",
            f"One undisturbed pull of this reference took {span:.2f} s of wall time (process start "
            "included); each kill comes uniformly within that span (seed "
            f"{args.seed}). A round starts from what the last kill left (resume), or from an empty "
            "directory when the last killed pull had already committed, so every kill hits a pull with "
            "work to do. After each kill: what a reader sees (the index lists none or all; every "
            "listed entry verified), verified blobs kept in tmp/ for the next pull, and bytes of partial "
            "blobs kept for a ranged resume.\n",
            "| kill | started from | after ms | process | reader sees | verified blobs kept | partial bytes kept |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Next pull: exit {rc}, {last.get('entries') if isinstance(last, dict) else last} entries added, "
            f"{last.get('bytes') if isinstance(last, dict) else '?'} bytes downloaded; keys and bytes equal "
            f"the source: {entries(target) == sm90}; verify: {'clean' if vrc == 0 else vout}.\n",
        ]
        # ---- registry killed mid-pull, then resumed
        proxy = CuttingProxy(server, limit=8 << 20)
        cut_dst = work / "cut"
        rc, out, err, _ = cli("pull", f"{proxy.host}/cutlass-aot/kernels:bench", "--cache-dir", cut_dst,
                              "--plain-http", "--arch", "sm_90a", json_out=False)
        seen = visible(cut_dst, sm90) if cut_dst.exists() else "no directory"
        server.start()
        rc2, out2, err2, _ = cli("pull", ref, "--cache-dir", cut_dst, "--plain-http", "--arch", "sm_90a")
        lines += [
            "## Registry killed mid-pull\n",
            f"A relay in front of the registry SIGKILLs it after 8 MB of responses. The pull: exit {rc}, "
            f"stderr `{err.strip()}`. A reader then sees: {seen}. Registry restarted, pull again: exit {rc2}, "
            f"{out2.get('bytes') if isinstance(out2, dict) else '?'} bytes downloaded (resumed), keys and "
            f"bytes equal the source: {entries(cut_dst) == sm90}.\n",
        ]
        # ---- tampered blob
        key = sorted(sm90)[0]
        victim = server.blob_file(sm90[key])
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        t_dst = work / "tampered"
        rc, out, err, _ = cli("pull", ref, "--cache-dir", t_dst, "--plain-http", "--arch", "sm_90a",
                              json_out=False)
        lines += [
            "## Tampered blob in the registry's storage\n",
            f"One artifact's blob file flipped in place (same size). The pull: exit {rc}, stderr "
            f"`{err.strip()}`. A reader then sees: {visible(t_dst, sm90) if t_dst.exists() else 'no directory'}; "
            f"partial files left: {len(list((t_dst / 'tmp').glob('pull-*.part'))) if t_dst.exists() else 0}.\n",
        ]
    finally:
        server.stop()
    text = header("Push and pull through an OCI registry (Debian docker-registry 2.8, 127.0.0.1)")
    text += (f"Source cache: {len(src_index['entries'])} entries, "
             f"{sum(r['size'] for r in src_index['entries'].values())} artifact bytes, "
             f"{sum(r['size'] for r in src_index['runtimes'].values() if r.get('path'))} runtime bytes "
             "(the shipped configs/ built by `cutlass-aot build`). Plain HTTP on loopback; the machine has "
             "2 cores shared with other work.\n\n")
    text += "\n".join(lines) + "\n"
    print(write(f"{dt.date.today().isoformat()}_push_pull.md", text, args.out))


if __name__ == "__main__":
    main()
