"""Compiler resource report (registers, shared memory, spills) of cached kernels.

Extracts the cubin each artifact embeds (an inner ELF with e_machine 190,
EM_CUDA) and runs `cuobjdump -res-usage` on it; needs the CUDA toolkit's
cuobjdump (the device machine has it). One line per distinct variant of
the bf16 linear signature, plus any variant named on the command line.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile

import cutlass_aot

EM_CUDA = 190


def embedded_cubins(data: bytes) -> list[bytes]:
    out, i = [], 1
    while (i := data.find(b"\x7fELF", i)) >= 0:
        if data[i + 4] == 2 and struct.unpack_from("<H", data, i + 18)[0] == EM_CUDA:
            shoff = struct.unpack_from("<Q", data, i + 40)[0]
            shentsize, shnum = struct.unpack_from("<HH", data, i + 58)
            out.append(data[i:i + shoff + shentsize * shnum])
        i += 4
    return out


def main() -> None:
    cache = cutlass_aot.open_cache(os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    rows = []
    for sig, entries in sorted(cache.by_signature.items(), key=lambda kv: str(kv[0])):
        f = dict(sig.fields)
        if (f["a"], f["a_major"], f["b_major"], f["d"], f["c"], f["rank"]) != ("bf16", "k", "k", "bf16", None, 2):
            continue
        for e in entries:
            lib = cache.path / e.record["path"]
            for cubin in embedded_cubins(lib.read_bytes()):
                with tempfile.NamedTemporaryFile(suffix=".cubin") as tmp:
                    tmp.write(cubin)
                    tmp.flush()
                    res = subprocess.run(["cuobjdump", "-res-usage", tmp.name], capture_output=True, text=True)
                usage = " ".join(line.strip() for line in res.stdout.splitlines() if "REG" in line)
                v = e.variant
                rows.append(f"{v['tile']} {v['cluster']} raster={v['raster']} swizzle={v['swizzle']}: {usage or res.stderr.strip()}")
    print("\n".join(rows))
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
