"""Opcode counts of compiled kernels, read from their SASS on a machine without a GPU.

Two questions a timing cannot answer alone, settled statically here:

* ``probe``: how the sm_90a assembler lowers each operation mufu_probe.py
  times (its kernels, compiled with nvcc to a cubin): whether
  ``tanh.approx.f16x2`` is one MUFU instruction for two values or two.
* ``resources``: which of a cache's kernels carry a stack frame or local
  memory (``cuobjdump -res-usage``), and whether the table picks them.
* ``diff A B``: what one artifact runs that another does not (say a
  bias+GELU variant against its bias-only twin): each artifact's device
  code is cut out of its ``kernel.so`` (the CUDA ELF the DSL embeds), read
  with ``cuobjdump -sass`` and counted by opcode (predicates dropped); the
  table lists the opcodes whose counts differ.

Counts are static: an instruction inside a loop counts once. The GEMM's
epilogue runs once a tile, so a diff of two epilogues is their per-tile,
per-thread difference.

Needs ``cuobjdump`` (the CUDA toolkit's, or PyPI's nvidia-cuda-cuobjdump
wheel) and, for ``probe``, ``nvcc``: ``--cuobjdump`` / ``--nvcc``, else
$CUOBJDUMP / $NVCC, PATH, or /usr/local/cuda*/bin.

    python3 benchmarks/sass_ops.py probe [--out FILE]
    python3 benchmarks/sass_ops.py diff KEY_A KEY_B --cache-dir DIR [--out FILE]
    python3 benchmarks/sass_ops.py resources --cache-dir DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import header, write

EM_CUDA = 190  # ELF e_machine of NVIDIA device code
OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def tool(name: str, given: str | None) -> str:
    """``name``'s path: ``given``, else $NAME, else PATH, else a CUDA toolkit's bin/."""
    path = (given or os.environ.get(name.upper()) or shutil.which(name)
            or next(iter(sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"))), None))
    if not path:
        raise SystemExit(f"sass_ops: {name} not found: pass --{name} PATH or set ${name.upper()} "
                         f"(PyPI's nvidia-cuda-{name} wheel carries one)")
    return path


def device_elves(blob: bytes) -> list[bytes]:
    """Every embedded CUDA ELF in ``blob`` (a host shared library), whole."""
    out, at = [], 0
    while (at := blob.find(b"\x7fELF", at + 1)) > 0:
        if len(blob) < at + 64 or struct.unpack_from("<H", blob, at + 18)[0] != EM_CUDA:
            continue
        phoff, shoff = struct.unpack_from("<QQ", blob, at + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
        out.append(blob[at:at + max(shoff + shentsize * shnum, phoff + phentsize * phnum)])
    return out


def sass(cuobjdump: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True)
    if res.returncode != 0 or "Function" not in res.stdout:
        raise SystemExit(f"sass_ops: cuobjdump read no device code: {res.stdout[:200]} {res.stderr[:200]}")
    return res.stdout


def opcodes(text: str) -> dict[str, collections.Counter]:
    """Per function in ``text`` (cuobjdump -sass), its opcode counts."""
    out: dict[str, collections.Counter] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), collections.Counter())
            continue
        op = OPCODE.match(line)
        if current is not None and op:
            current[op.group(1)] += 1
    return out


def probe(args) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mufu_probe import KERNELS, MODES  # noqa: PLC0415

    nvcc, cuobjdump = tool("nvcc", args.nvcc), tool("cuobjdump", args.cuobjdump)
    inst = "".join(f"template __global__ void probe<{i}>(float*, long long*, int, float);\n"
                   for i, _, _ in MODES.values())
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "probe.cu", Path(tmp) / "probe.cubin"
        src.write_text(KERNELS + inst)
        res = subprocess.run([nvcc, "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                              "-o", str(cubin), str(src)], capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"sass_ops: nvcc failed: {res.stderr[-2000:]}")
        funcs = opcodes(sass(cuobjdump, cubin.read_bytes()))
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    lines = [header("SASS of mufu_probe.py's kernels on sm_90a (static counts)"),
             f"nvcc: {version}; `-O3 -gencode=arch=compute_90a,code=sm_90a`. Each kernel's loop body "
             "runs the mode's operation on 8 independent chains, unrolled by the compiler, so the "
             "f32 modes' MUFU count is the number of PTX operations in the unrolled body; a packed "
             "mode (two values a PTX op) with twice that count is split into one MUFU a value.\n",
             "| mode | values a PTX op | MUFU opcodes | FP32 FMUL / FFMA | PRMT (repacking) |",
             "|---|---|---|---|---|"]
    for name, (_, per_op, frag) in MODES.items():
        ops = next((c for f, c in funcs.items() if frag in f), collections.Counter())
        mufu = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items()) if k.startswith("MUFU")) or "none"
        lines.append(f"| {name} | {per_op} | {mufu} | {ops['FMUL']} / {ops['FFMA']} | {ops['PRMT']} |")
    return "\n".join(lines) + "\n"


def diff(args) -> str:
    cuobjdump = tool("cuobjdump", args.cuobjdump)
    entries = Path(args.cache_dir) / "entries"
    counts, names = [], []
    for prefix in (args.a, args.b):
        hits = sorted(entries.glob(f"{prefix}*"))
        if len(hits) != 1:
            raise SystemExit(f"sass_ops: {len(hits)} cache entries start with {prefix!r} in {entries}")
        elves = device_elves((hits[0] / "kernel.so").read_bytes())
        if not elves:
            raise SystemExit(f"sass_ops: no CUDA device code in {hits[0] / 'kernel.so'}")
        total = collections.Counter()
        for elf in elves:
            for c in opcodes(sass(cuobjdump, elf)).values():
                total.update(c)
        counts.append(total)
        names.append(hits[0].name[:12])
    a, b = counts
    lines = [header(f"SASS opcode counts: {names[0]} against {names[1]}"),
             f"Static counts over each artifact's device code (cuobjdump -sass; predicates "
             f"dropped). Totals: {names[0]} {sum(a.values())}, {names[1]} {sum(b.values())}. "
             "Opcodes whose counts differ, largest difference first.\n",
             f"| opcode | {names[0]} | {names[1]} | difference |", "|---|---|---|---|"]
    for op in sorted(set(a) | set(b), key=lambda o: (-abs(a[o] - b[o]), o)):
        if a[op] != b[op]:
            lines.append(f"| {op} | {a[op]} | {b[op]} | {a[op] - b[op]:+d} |")
    return "\n".join(lines) + "\n"


def resources(args) -> str:
    """Every artifact's kernels' register count and stack frame (cuobjdump
    -res-usage): the ones with a stack frame or local memory listed, with
    their device code's local stores and loads (spills land in the stack
    frame) and whether the selection table picks them."""
    cuobjdump = tool("cuobjdump", args.cuobjdump)
    root = Path(args.cache_dir)
    picked = set()
    for table in (root / "tables").glob("*.json"):
        picked |= {row["artifact"] for row in json.loads(table.read_text()).get("rows", [])}
    usage = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
    kernels, flagged = 0, []
    for entry in sorted((root / "entries").iterdir()):
        variant = json.loads((entry / "entry.json").read_text()).get("variant", {})
        for elf in device_elves((entry / "kernel.so").read_bytes()):
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(elf)
                f.flush()
                out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True,
                                     text=True).stdout
            spill = None
            for m in usage.finditer(out):
                kernels += 1
                reg, stack, local = int(m.group(2)), int(m.group(3)), int(m.group(5))
                if stack or local:
                    if spill is None:  # local stores and loads in this device code, static
                        ops = collections.Counter()
                        for c in opcodes(sass(cuobjdump, elf)).values():
                            ops.update(c)
                        spill = (sum(v for k, v in ops.items() if k.startswith("STL")),
                                 sum(v for k, v in ops.items() if k.startswith("LDL")))
                    form = "/".join(str(variant.get(k)) for k in ("a", "tile", "cluster"))
                    extras = [f"{k}={variant[k]}" for k in ("k_cluster", "swap_ab", "split_k", "pingpong",
                                                             "bias", "act")
                              if variant.get(k) not in (None, False, "none")
                              and not (k == "k_cluster" and variant[k] == 1)]
                    flagged.append((entry.name[:12], form, " ".join(extras), reg, stack, local,
                                    f"{spill[0]} / {spill[1]}", "yes" if entry.name in picked else ""))
    lines = [header("Kernels with a stack frame or local memory (cuobjdump -res-usage)"),
             f"{kernels} kernels in {args.cache_dir}; {len(flagged)} with a stack frame or local "
             "memory. REG is the launch register count (consumer warpgroups may raise theirs with "
             "setmaxnreg). 'table' says whether the selection table picks the artifact.\n",
             "| entry | a / tile / cluster | schedule and epilogue | REG | STACK bytes | LOCAL bytes "
             "| STL / LDL in the SASS (static) | table |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {e} | {form} | {extras} | {reg} | {stack} | {local} | {sl} | {tab} |"
              for e, form, extras, reg, stack, local, sl, tab in sorted(flagged, key=lambda r: (r[1], r[2]))]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuobjdump", default=None)
    ap.add_argument("--out", default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="mufu_probe.py's kernels, compiled with nvcc")
    p.add_argument("--nvcc", default=None)
    d = sub.add_parser("diff", help="two cache entries' opcode counts")
    d.add_argument("a", help="entry key (or a unique prefix)")
    d.add_argument("b", help="entry key (or a unique prefix)")
    d.add_argument("--cache-dir", required=True)
    r = sub.add_parser("resources", help="kernels with a stack frame or local memory")
    r.add_argument("--cache-dir", required=True)
    args = ap.parse_args()
    text = {"probe": probe, "diff": diff, "resources": resources}[args.cmd](args)
    print(text)
    print("wrote", write(f"sass_{args.cmd}.md", text, args.out))


if __name__ == "__main__":
    main()
