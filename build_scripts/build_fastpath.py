"""Build cutlass_aot/run/_fastpath.so, the dispatch entry's C++ half.

    python build_scripts/build_fastpath.py [--cxx g++] [--require]

Compiles run/fastpath.cc against the installed tvm-ffi's headers with the
C++ compiler ($CXX, else c++ or g++), stamped with the source's sha256 and
the tvm-ffi version (run/fastpath.py refuses a library whose stamp is not
the installed source's). The library's tvm-ffi symbols resolve at load
time from the libtvm_ffi that ``import tvm_ffi`` loaded, as the cache's
artifacts do. Written to a temporary name and renamed, so a running process
never sees half a file. Without a compiler it says so and exits 0 (dispatch
stays all Python), unless --require.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutlass_aot.run import fastpath  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default=os.environ.get("CXX"))
    ap.add_argument("--require", action="store_true", help="fail (exit 1) without a compiler")
    args = ap.parse_args()
    cxx = args.cxx or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        print("build_fastpath: no C++ compiler (set CXX); dispatch stays all Python",
              file=sys.stderr)
        return 1 if args.require else 0
    import tvm_ffi.libinfo  # noqa: PLC0415

    stamp = fastpath.expected_stamp()
    fd, tmp = tempfile.mkstemp(prefix="._fastpath-", suffix=".so", dir=fastpath.HERE)
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
           f"-I{tvm_ffi.libinfo.find_include_path()}",
           f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}",
           f'-DCUTLASS_AOT_FASTPATH_STAMP="{stamp}"', "-o", tmp, str(fastpath.SOURCE)]
    try:
        subprocess.run(cmd, check=True)
        os.replace(tmp, fastpath.LIBRARY)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"build_fastpath: {' '.join(cmd)} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"build_fastpath: {fastpath.LIBRARY} ({stamp})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
