"""Fixtures for the CPU suite, the `gpu` marker, and the reliability table.

* ``tiny_manifest``: TINY_MANIFEST (three sm90_gemm variants) in a session dir.
* ``built_cache``: that manifest compiled ONCE per session by the real
  builder (spawn workers, real CuTe DSL cross-compiles, real publish). Tests
  must not modify it: they read it, or take ``cache_copy``.
* ``cache_copy``: a private copy of the built cache for a test that mutates it.
* ``cache_dir``: a fresh, not yet existing cache directory.
* ``load_spy``: records the loader's tvm_ffi.load_module calls ("before dlopen").

Items marked ``gpu`` are skipped at collection when torch sees no CUDA device.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import (
    TINY_MANIFEST,
    TINY_VARIANTS,
    LoadSpy,
    copy_cache,
    make_tree_writable,
    results_table,
    tree_snapshot,
)

# Reproducible property tests that write nothing into the work tree.
settings.register_profile("cutlass-aot", database=None, deadline=None, derandomize=True,
                          print_blob=True)
settings.load_profile("cutlass-aot")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped at collection when none is present)")
    config.addinivalue_line("markers", "slow: long-running reliability scenario")


def _cuda_available() -> bool:
    import torch  # noqa: PLC0415 - only when gpu-marked tests were collected

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in gpu_items:
        item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = results_table()
    if not lines:
        return
    terminalreporter.write_sep("=", "cutlass-aot reliability results")
    for line in lines:
        terminalreporter.write_line(line)


@dataclass(frozen=True)
class BuiltCache:
    path: Path
    manifest: Path
    keys: tuple[str, ...]
    report: object
    snapshot: dict


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("manifest") / "tiny.yaml"
    path.write_text(TINY_MANIFEST)
    return path


@pytest.fixture(scope="session")
def built_cache(tmp_path_factory: pytest.TempPathFactory, tiny_manifest: Path) -> BuiltCache:
    from cutlass_aot.builder.driver import build  # noqa: PLC0415 - build side only where needed
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415

    path = tmp_path_factory.mktemp("built") / "cache"
    report = build([load_manifest(tiny_manifest)], path, jobs=2)
    assert not report.failed, report.failed
    assert len(report.built) == TINY_VARIANTS and not report.cached, report.as_dict()
    built = BuiltCache(path=path, manifest=tiny_manifest, keys=tuple(sorted(report.built)),
                       report=report, snapshot=tree_snapshot(path))
    yield built
    # Tests read this cache in place: none of them may have written to it.
    assert tree_snapshot(path) == built.snapshot, "a test modified the shared session cache"


@pytest.fixture
def cache_copy(built_cache: BuiltCache, tmp_path: Path) -> Path:
    dst = copy_cache(built_cache.path, tmp_path / "cache")
    yield dst
    # Copies hold a 40 MB runtime library: do not let pytest keep them around.
    make_tree_writable(dst)
    shutil.rmtree(dst, ignore_errors=True)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "fresh-cache"
    yield path
    make_tree_writable(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def load_spy(monkeypatch) -> LoadSpy:
    """Counts the loader's tvm_ffi.load_module calls (see LoadSpy)."""
    return LoadSpy(monkeypatch)
