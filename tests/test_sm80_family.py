"""The sm80_gemm family, the shipped multi-arch manifests, and one cache with several archs.

Real compiles: a module fixture cross-compiles one sm80_gemm variant for each
of sm_80, sm_86, sm_89 and sm_90 (one per copy width: 16, 8, 4 and 2 bytes)
plus one sm90_gemm variant for sm_90a into one cache, with the real builder.
The tests then read what the artifacts really contain (the cubin's target in
its ELF header), list them per arch through the CLI, load them through
tvm_ffi, and check the refusal a device with no runnable entry gets.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cutlass_aot.archs import (
    ALIGNMENTS,
    call_alignment,
    embedded_targets,
    parse_arch,
    runnable_archs,
    servable_aligns,
    tensor_alignment,
)
from cutlass_aot.builder.family import load_family
from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.cli import main
from cutlass_aot.errors import KernelNotFoundError
from cutlass_aot.kernels.sm80 import SMEM_CAPACITY, Sm80GemmFamily, smem_bytes
from cutlass_aot.layout import GEMM_ABI, read_index, resolve_inside
from cutlass_aot.run.load import Cache
from cutlass_aot.signature import Signature
from tests.support import REPO, make_tree_writable, run_cli_json

CONFIGS = REPO / "configs"
AMPERE = ("sm_80", "sm_86", "sm_89")

# One small variant per arch and copy width, and a wgmma one beside them.
MULTI_ARCH = {
    "sm_80": ("sm80_gemm", {"a": "bf16", "tile": "64x64", "warps": "2x2", "stages": 3, "align": 16}),
    "sm_86": ("sm80_gemm", {"a": "f16", "tile": "64x64", "warps": "2x2", "stages": 3, "align": 8,
                            "b_major": "n", "with_c": True}),
    "sm_89": ("sm80_gemm", {"a": "bf16", "tile": "64x64", "warps": "2x2", "stages": 3, "align": 4,
                            "d": "f32", "d_major": "m", "rank": 3}),
    "sm_90": ("sm80_gemm", {"a": "bf16", "tile": "64x64", "warps": "2x2", "stages": 3, "align": 2,
                            "a_major": "m"}),
    "sm_90a": ("sm90_gemm", {"a": "bf16", "tile": "128x128"}),
}


def _manifest_text(arch: str, family: str, params: dict) -> str:
    return yaml.safe_dump({"arch": arch, "kernels": [{"family": family, "params": params}]})


@pytest.fixture(scope="module")
def multi_arch(tmp_path_factory):
    from cutlass_aot.builder.driver import build  # noqa: PLC0415 - build side only here

    root = tmp_path_factory.mktemp("multi-arch")
    manifests = []
    for arch, (family, params) in MULTI_ARCH.items():
        path = root / f"{arch}.yaml"
        path.write_text(_manifest_text(arch, family, params))
        manifests.append(path)
    cache = root / "cache"
    report = build([load_manifest(p) for p in manifests], cache, jobs=2)
    assert not report.failed, report.as_dict()
    assert len(report.built) == len(MULTI_ARCH), report.as_dict()
    yield cache, manifests
    make_tree_writable(cache)
    shutil.rmtree(cache, ignore_errors=True)


# ------------------------------------------------------------------ archs
@pytest.mark.parametrize("device, expected", [
    ("sm_80", ["sm_80"]),
    ("sm_86", ["sm_86", "sm_80"]),
    ("sm_89", ["sm_89", "sm_86", "sm_80"]),
    ("sm_90a", ["sm_90a", "sm_90"]),
    ("sm_90", ["sm_90"]),
    ("sm_100a", ["sm_100a", "sm_100"]),
])
def test_runnable_archs_follow_binary_compatibility(device, expected):
    assert runnable_archs(device) == expected
    # Nothing built for major 8 runs on Hopper and back (SASS only, no PTX).
    assert not any(parse_arch(a)[0] != parse_arch(device)[0] for a in runnable_archs(device))


@pytest.mark.parametrize("bad", ["sm80", "90a", "sm_", "sm_9", "sm_x0", None])
def test_parse_arch_refuses_junk(bad):
    with pytest.raises(ValueError):
        parse_arch(bad)


def test_call_alignment_examples():
    # nn.Linear at K = 2049 (bf16): rows of x and of W are 4098 bytes apart.
    assert call_alignment([(0x7F0000000000, (2049, 1), 2), (0x7F0000100000, (1, 2049), 2),
                           (0x7F0000200000, (4095, 1), 2)]) == 2
    assert tensor_alignment(0x1000, (4096, 1), 2) == 16
    assert tensor_alignment(0x1008, (4096, 1), 2) == 8          # view at an 8-byte offset
    assert tensor_alignment(0x1000, (2052, 1), 2) == 8          # 4104-byte rows
    assert tensor_alignment(0x1000, (4, 4096, 1), 2) == 8       # batch stride 8 bytes
    assert tensor_alignment(0x1000, (1, 4099), 4) == 4          # f32: at least 4
    # A last dim of 1: torch strides (1, 1); the row stride is 2 bytes, not "unit".
    assert tensor_alignment(0x1000, (1, 1), 2) == 2
    assert tensor_alignment(0x1000, (8, 1), 2) == 16
    assert tensor_alignment(0x1000, (1, 8), 2) == 16            # column-major, ld 8
    assert servable_aligns(16) == [16, 8, 4, 2] and servable_aligns(4) == [4, 2]
    assert servable_aligns(2) == [2]


@given(ptr=st.integers(0, 2**48).map(lambda x: x * 2),
       strides=st.lists(st.integers(1, 10**6), min_size=1, max_size=3),
       elem=st.sampled_from([2, 4]))
def test_tensor_alignment_matches_a_gcd_oracle(ptr, strides, elem):
    ptr = ptr * elem // 2
    got = tensor_alignment(ptr, strides, elem)
    inner = next((d for d in (len(strides) - 1, len(strides) - 2) if d >= 0 and strides[d] == 1), None)
    others = [s * elem for d, s in enumerate(strides) if d != inner]
    g = math.gcd(ptr, *others, 16) or 16
    oracle = max(min(16, g & -g), elem)
    assert got == oracle and got in ALIGNMENTS
    # The pointer and every byte stride but the contiguous dim's are multiples
    # of the answer, unless the element size alone sets it.
    if got > elem:
        assert ptr % got == 0 and all(x % got == 0 for x in others)


def test_embedded_targets_refuses_a_truncated_fatbinary():
    blob = Path(__file__).read_bytes()[:64] + bytes.fromhex("50ed55ba") + b"\x01\x00\x10\x00" + \
        (10**6).to_bytes(8, "little")
    with pytest.raises(ValueError, match="past the end"):
        embedded_targets(blob)
    assert embedded_targets(b"no fatbinary here") == []


# -------------------------------------------------------------- manifests
def test_shipped_manifests_cover_every_arch_and_validate():
    by_arch = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        m = load_manifest(path)
        assert m.variants and not m.skipped, path
        by_arch.setdefault(m.arch, []).append(m)
    assert {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"} <= set(by_arch)
    fam = Sm80GemmFamily()
    for arch in (*AMPERE, "sm_90"):
        for m in by_arch[arch]:
            for v in m.variants:
                assert v.family_ref == "sm80_gemm"
                params = v.param_dict
                assert fam.reject(params, arch) is None
                assert fam.signature(params, arch).get("align") == params["align"]
    # Ampere-class manifests: every variant fits the smallest Ampere-class SM,
    # so an sm_80 cache serves sm_86/sm_89 too (archs.runnable_archs).
    for arch in AMPERE:
        for v in by_arch[arch][0].variants:
            assert smem_bytes(v.param_dict) <= SMEM_CAPACITY["sm_86"], v
    # Hopper low-alignment manifest: only what TMA cannot take.
    lowalign = [v.param_dict["align"] for m in by_arch["sm_90"] for v in m.variants]
    assert set(lowalign) == {8, 4, 2}


def _fields(sig: Signature) -> tuple:
    return tuple((k, v) for k, v in sig.fields if k != "align")


def test_ampere_manifests_mirror_the_hopper_signatures():
    """Every sm_90a signature of linear/residual/batched/fp32-out is served on sm_8x."""
    hopper = load_manifest(CONFIGS / "sm90.yaml")
    sm90 = load_family("sm90_gemm")
    wanted = {_fields(sm90.signature(v.param_dict, "sm_90a")) for v in hopper.variants
              if v.label in ("linear", "linear-residual", "batched", "fp32-out")}
    assert len(wanted) >= 12
    fam = Sm80GemmFamily()
    for arch in AMPERE:
        m = load_manifest(CONFIGS / f"sm{arch[3:]}.yaml")
        have = {_fields(fam.signature(v.param_dict, arch)) for v in m.variants}
        assert wanted <= have, (arch, wanted - have)


@pytest.mark.parametrize("params, arch, reason", [
    ({"b": "f16"}, "sm_80", "same dtype"),
    ({"tile": "128x256", "warps": "2x2"}, "sm_80", "accumulators per thread"),
    ({"tile": "128x256", "warps": "2x4", "stages": 6, "bk": 64}, "sm_80", "exceed sm_80"),
    ({"tile": "128x128", "stages": 5, "bk": 64}, "sm_86", "exceed sm_86"),
    ({}, "sm_90a", "targets"),
])
def test_family_rejects_unbuildable_variants_with_a_reason(params, arch, reason):
    fam = Sm80GemmFamily()
    v = {**fam.defaults, "a": "bf16", **params}
    got = fam.reject(v, arch)
    assert got is not None and reason in got


def test_align_is_part_of_the_signature_and_the_key():
    from cutlass_aot.builder.plan import plan  # noqa: PLC0415 - build side

    fam = Sm80GemmFamily()
    base = {**fam.defaults, "a": "bf16"}
    sigs = {fam.signature({**base, "align": a}, "sm_90") for a in ALIGNMENTS}
    assert len(sigs) == 4 and {s.get("align") for s in sigs} == set(ALIGNMENTS)
    assert all(s.arch == "sm_90" for s in sigs)
    assert fam.abi == GEMM_ABI  # the run side calls it like sm90_gemm
    del plan


# ----------------------------------------------- one cache, several archs
def test_every_artifact_embeds_sass_for_its_manifest_arch_only(multi_arch):
    cache, _ = multi_arch
    index = read_index(cache)
    seen = set()
    for key, rec in index["entries"].items():
        blob = resolve_inside(cache, rec["path"]).read_bytes()
        targets = embedded_targets(blob)
        arch = rec["signature"]["arch"]
        # Exactly one cubin, for exactly the manifest's arch (the "a" bit
        # included), and no PTX that a newer driver could JIT elsewhere.
        assert [(t.kind, t.arch) for t in targets] == [("sass", arch)], (key[:12], targets)
        assert targets[0].fatbin_arch == parse_arch(arch)[0] * 10 + parse_arch(arch)[1]
        seen.add(arch)
    assert seen == set(MULTI_ARCH)


def test_index_signatures_carry_arch_and_align(multi_arch):
    cache, _ = multi_arch
    c = Cache(cache)
    assert c.archs() == sorted(MULTI_ARCH)
    aligns = {s.arch: s.get("align") for s in c.signatures()}
    assert aligns == {"sm_80": 16, "sm_86": 8, "sm_89": 4, "sm_90": 2, "sm_90a": 16}
    assert all(e.record["abi"] == GEMM_ABI for e in c.entries.values())


def test_ls_and_info_show_entries_per_arch(multi_arch):
    cache, _ = multi_arch
    runner = CliRunner()
    res = runner.invoke(main, ["ls", "--cache-dir", str(cache)])
    assert res.exit_code == 0, res.output
    for arch in MULTI_ARCH:
        assert f"{arch}: 1 entries" in res.output
        assert f"gemm[{arch}](" in res.output
    res = runner.invoke(main, ["ls", "--cache-dir", str(cache), "--arch", "sm_86", "--json"])
    import json  # noqa: PLC0415

    rows = json.loads(res.output)["entries"]
    assert [r["arch"] for r in rows] == ["sm_86"] and rows[0]["signature"].startswith("gemm[sm_86]")
    res = runner.invoke(main, ["info", "--cache-dir", str(cache), "--json"])
    data = json.loads(res.output)
    assert data["archs"] == {a: {"entries": 1, "signatures": 1} for a in MULTI_ARCH}
    res = runner.invoke(main, ["info", "--cache-dir", str(cache)])
    assert all(f"  {a}" in res.output for a in MULTI_ARCH)


def test_build_arch_filter_builds_only_that_arch(multi_arch):
    cache, manifests = multi_arch
    code, data, err = run_cli_json("build", *manifests, "--cache-dir", cache, "--arch", "sm_86",
                                   "--no-bundle-runtime")
    assert code == 0, err
    assert (data["total"], data["cached"], data["built"]) == (1, 1, 0)


def test_sm80_artifacts_load_through_tvm_ffi_and_check_their_arguments(multi_arch):
    """Each artifact dlopens on a CPU host and refuses CPU tensors itself.

    The refusal names the device, which proves the call reached the
    artifact's own argument checks with the GEMM ABI's arity.
    """
    cache, _ = multi_arch
    c = Cache(cache)
    for e in c.entries.values():
        if e.record["family"] != "sm80_gemm":
            continue
        fn = c.function(e.key)
        sig = dict(e.signature.fields)
        dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
        batch = (2,) if sig["rank"] == 3 else ()
        a = torch.zeros(*batch, 64, 32, dtype=dt[sig["a"]])
        b = torch.zeros(*batch, 32, 64, dtype=dt[sig["b"]])
        d = torch.zeros(*batch, 64, 64, dtype=dt[sig["d"]])
        args = (a, b, d, d, 1.0, 0.0, 0) if sig["c"] else (a, b, d, 1.0, 0)
        with pytest.raises(Exception, match="(?i)cuda|device"):
            fn(*args)


def test_device_without_a_runnable_arch_gets_a_clear_refusal(multi_arch, tmp_path):
    cache, manifests = multi_arch
    c = Cache(cache)
    sig = next(iter(c.signatures()))
    # The device runs something in this cache: the dispatcher goes on to
    # match fields (and Cache.not_found explains a miss).
    for device in ("sm_80", "sm_86", "sm_89", "sm_90a"):
        assert c.arch_not_found(sig, device) is None
    err = c.arch_not_found(sig, "sm_100a")
    assert isinstance(err, KernelNotFoundError)
    msg = str(err)
    assert "sm_100a" in msg and all(a in msg for a in MULTI_ARCH)
    assert err.data["device_arch"] == "sm_100a" and err.data["cache_archs"] == sorted(MULTI_ARCH)
    assert "configs/sm100.yaml" in msg
    # A cache holding only Ampere-class code refuses a Hopper device: keep the
    # sm_80 entry alone (real gc), then ask as an H200 would.
    only = tmp_path / "only-sm80"
    shutil.copytree(cache, only, symlinks=True)
    code, data, errtext = run_cli_json("gc", manifests[0], "--cache-dir", only)
    assert code == 0, errtext
    c80 = Cache(only)
    assert c80.archs() == ["sm_80"]
    err = c80.arch_not_found(sig, "sm_90a")
    assert err is not None
    assert "device is sm_90a" in str(err) and "entries for sm_80" in str(err)
    assert "sm_90a, sm_90" in str(err) and "configs/sm90.yaml" in str(err)
    assert c80.arch_not_found(sig, "sm_89") is None  # sm_80 code runs on an L4
    make_tree_writable(only)


def test_a_two_stage_ring_is_refused_by_the_manifest_with_the_allowed_depths(tmp_path):
    from cutlass_aot.builder.manifest import load_manifest as load  # noqa: PLC0415 - build side
    from cutlass_aot.errors import ManifestError  # noqa: PLC0415

    path = tmp_path / "m.yaml"
    path.write_text("arch: sm_80\nkernels:\n  - family: sm80_gemm\n    params:\n      a: bf16\n"
                    "      stages: 2\n")
    with pytest.raises(ManifestError) as info:
        load(path)
    text = str(info.value)
    assert "stages" in text and "3, 4, 5, 6" in text, text
