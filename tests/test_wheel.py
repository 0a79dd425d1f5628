"""A non-editable install: the wheel carries the default manifests, and an
installation without them says what to do instead of failing obscurely.

Builds a real wheel from a copy of the source tree (so the work tree gets no
build/ or egg-info), installs it into a private directory and runs it with
nothing of the checkout on the path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.support import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    for name in ("cutlass_aot", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("cutlass_aot-*.whl")
    site = tmp / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site


def _run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # -S: no site hooks, so the checkout's editable install is invisible; the
    # dependencies come from this interpreter's site-packages, after the wheel.
    path = f"{site}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_wheel_ships_the_default_manifests(installed, tmp_path):
    code = ("import cutlass_aot, json\n"
            "from cutlass_aot.builder.manifest import default_manifests, load_manifests\n"
            "paths = default_manifests()\n"
            "ms = load_manifests(paths)\n"
            "print(json.dumps([cutlass_aot.__file__, [str(p) for p in paths], sum(len(m.variants) for m in ms)]))\n")
    proc = _run(installed, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json  # noqa: PLC0415

    module, paths, variants = json.loads(proc.stdout)
    assert module.startswith(str(installed))
    assert [Path(p).name for p in paths] == sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    shipped = {p.name for p in (installed / "cutlass_aot" / "configs").iterdir()}
    assert {p.name for p in (REPO / "configs").glob("*.json")} <= shipped  # tables manifests name
    assert all(p.startswith(str(installed / "cutlass_aot" / "configs")) for p in paths)
    assert variants > 0


def test_an_install_without_manifests_names_the_fix(installed, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    shutil.rmtree(site / "cutlass_aot" / "configs")
    proc = _run(site, "-m", "cutlass_aot.cli", "build", "--cache-dir", str(tmp_path / "c"), cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert "pass manifest paths" in proc.stderr


def test_pyproject_lists_every_package():
    """The explicit package list (needed for the configs mapping) misses nothing."""
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "cutlass_aot").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert on_disk <= listed, f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"
    assert conf["package-dir"]["cutlass_aot.configs"] == "configs"


def test_a_wheel_built_after_the_fast_path_ships_it(installed, tmp_path):
    """The dispatch entry's C++ half travels as package data: a wheel built
    from a tree where build_scripts/build_fastpath.py ran (``make install``
    runs it) carries the library and its source, and the installed copy
    passes the stamp check; without the library the wheel says how to build it."""
    from cutlass_aot.run import fastpath  # noqa: PLC0415

    code = "from cutlass_aot.run import fastpath; print(fastpath.status())"
    proc = _run(installed, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = installed / "cutlass_aot" / "run"
    assert (run_dir / "fastpath.cc").is_file()
    if fastpath.LIBRARY.is_file():
        assert (run_dir / "_fastpath.so").is_file()
        assert proc.stdout.strip() == "on", proc.stdout
    else:
        assert proc.stdout.strip().startswith("off: _fastpath.so is not built"), proc.stdout
