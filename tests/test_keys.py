"""Content keys: the canonical encoding fails closed, and everything that
decides an artifact's bytes reaches the key (every family parameter, the
arch, the options, each part of the toolchain, the kernel sources).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutlass_aot import __version__
from cutlass_aot.builder import plan as plan_mod
from cutlass_aot.builder.family import files_digest
from cutlass_aot.builder.manifest import Variant
from cutlass_aot.errors import BuildError
from cutlass_aot.kernels.sm90 import Sm90GemmFamily
from cutlass_aot.keys import KEY_SCHEME, content_key, encode

FAMILY = Sm90GemmFamily()
BASE_PARAMS = {**Sm90GemmFamily.defaults, "a": "bf16"}


def variant(params: dict | None = None, arch: str = "sm_90a", family: str = "sm90_gemm") -> Variant:
    p = dict(BASE_PARAMS if params is None else params)
    return Variant(family, tuple(sorted(p.items())), arch, "test:1", "")


def key_of(v: Variant) -> str:
    return content_key(plan_mod.key_inputs(v))


@pytest.fixture
def fresh_toolchain():
    """Forget the cached toolchain/sources before and after a test that alters them."""
    plan_mod.toolchain.cache_clear()
    plan_mod._sources.cache_clear()
    yield
    plan_mod.toolchain.cache_clear()
    plan_mod._sources.cache_clear()


# ------------------------------------------------------------------ encoding
@pytest.mark.parametrize(
    "x, y",
    [
        (["a", "b"], ["ab"]),
        (["ab", ""], ["a", "b"]),
        (["a", "bc"], ["ab", "c"]),
        ([["a"], "b"], ["a", ["b"]]),
        (1, "1"),
        (1, True),
        (0, False),
        ("1", True),
        (None, "None"),
        (None, 0),
        (b"ab", "ab"),
        ([], {}),
        ([1, 2], (1,)),
        ({"a": "b"}, ["a", "b"]),
        ({"ab": ""}, {"a": "b"}),
        (-1, "-1"),
        (10, [1, 0]),
    ],
)
def test_encode_distinguishes(x, y):
    assert encode(x) != encode(y)
    assert content_key({"v": x}) != content_key({"v": y})


def test_encode_dict_order_insensitive_and_tuple_equals_list():
    a = {"x": 1, "y": [True, None, "s"], "z": {"p": b"q", "o": 2}}
    b = {"z": {"o": 2, "p": b"q"}, "y": [True, None, "s"], "x": 1}
    assert encode(a) == encode(b)
    assert content_key(a) == content_key(b)
    assert encode((1, "a")) == encode([1, "a"])


def test_content_key_is_a_hex_sha256_with_a_scheme():
    key = content_key({"a": 1})
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == content_key({"a": 1})
    assert KEY_SCHEME in encode(KEY_SCHEME).decode()


@pytest.mark.parametrize(
    "value, where",
    [
        (1.0, "$"),
        (float("nan"), "$"),
        ({1, 2}, "$"),
        (frozenset(), "$"),
        (object(), "$"),
        ([1, 2.5], "$[1]"),
        ({"a": {"b": [None, {3.0}]}}, "$.a.b[1]"),
        (complex(1, 2), "$"),
        (bytearray(b"x"), "$"),
    ],
)
def test_encode_refuses_values_without_canonical_form(value, where):
    with pytest.raises(TypeError, match="cannot fingerprint") as info:
        encode(value)
    assert where in str(info.value)
    with pytest.raises(TypeError):
        content_key({"v": value})


@pytest.mark.parametrize("bad", [{1: "a"}, {None: 1}, {("a",): 1}, {"a": 1, 2: "b"}])
def test_encode_refuses_non_string_dict_keys(bad):
    with pytest.raises(TypeError, match="not a str"):
        encode(bad)


# ------------------------------------------------------------- key inputs
def test_key_inputs_hold_the_whole_toolchain(fresh_toolchain):
    inputs = plan_mod.key_inputs(variant())
    tool = inputs["toolchain"]
    dsl_dists = {
        d.metadata["Name"].lower(): d.version
        for d in md.distributions()
        if (d.metadata["Name"] or "").lower().startswith("nvidia-cutlass-dsl")
    }
    assert dsl_dists, "nvidia-cutlass-dsl must be installed for these tests"
    assert "nvidia-cutlass-dsl" in dsl_dists
    assert tool["cutlass_dsl"] == dsl_dists  # every nvidia-cutlass-dsl* distribution
    assert tool["tvm_ffi"] == md.version("apache-tvm-ffi")
    assert tool["cutlass_aot"] == __version__
    gcc = subprocess.run([plan_mod.LINKER, "--version"], capture_output=True, text=True, check=True)
    assert tool["linker"] == gcc.stdout.splitlines()[0]
    assert inputs["sources"] == FAMILY.sources_digest()
    assert inputs["arch"] == "sm_90a"
    assert inputs["options"] == plan_mod.compile_options("sm_90a")
    assert "sm_90a" in inputs["options"]
    assert inputs["family"] == "sm90_gemm"
    assert inputs["abi"] == Sm90GemmFamily.abi and inputs["symbol"] == Sm90GemmFamily.symbol
    assert inputs["params"] == BASE_PARAMS
    assert inputs["signature"] == FAMILY.signature(BASE_PARAMS, "sm_90a").as_dict()
    encode(inputs)  # every key input has a canonical encoding


def test_every_family_parameter_reaches_the_key():
    """Change each parameter of Sm90GemmFamily to each other allowed value."""
    base_key = key_of(variant())
    assert set(plan_mod.key_inputs(variant())["params"]) == set(Sm90GemmFamily.params)
    seen_keys = {base_key}
    tried = 0
    for name, allowed in Sm90GemmFamily.params.items():
        others = [v for v in allowed if not (v == BASE_PARAMS[name] and type(v) is type(BASE_PARAMS[name]))]
        accepted = 0
        for value in others:
            params = {**BASE_PARAMS, name: value}
            if FAMILY.reject(params, "sm_90a"):
                continue
            accepted += 1
            tried += 1
            key = key_of(variant(params))
            assert key != base_key, f"changing {name} to {value!r} does not change the key"
            assert key not in seen_keys, f"{name}={value!r} collides with another variant's key"
            seen_keys.add(key)
        if others and name not in ("pingpong", "k_cluster", "promote"):
            assert accepted, f"no buildable alternative value to test for parameter {name!r}"
    # Rejected alone: b=f16 (A is bf16), bias=f16 (neither D's dtype nor f32),
    # the two tiles with N < 32 (swap-AB only), pingpong (one warpgroup
    # cannot hold the base's 128x256 tile), k_cluster 2..4 (the base's
    # tile is above 128x64) and promote 4, 8, 16 (a second copy of 128
    # accumulators a thread): pingpong is checked at 128x128, k_cluster and
    # promote at 128x64.
    assert tried == sum(len(v) - 1 for v in Sm90GemmFamily.params.values()) - 11
    small = {**BASE_PARAMS, "tile": "128x128"}
    assert not FAMILY.reject({**small, "pingpong": True}, "sm_90a")
    assert key_of(variant({**small, "pingpong": True})) != key_of(variant(small))
    narrow = {**BASE_PARAMS, "tile": "128x64"}
    keys = {key_of(variant(narrow))}
    for kc in (2, 3, 4):
        assert not FAMILY.reject({**narrow, "k_cluster": kc}, "sm_90a")
        keys.add(key_of(variant({**narrow, "k_cluster": kc})))
    assert len(keys) == 4
    for promote in (4, 8, 16):
        assert not FAMILY.reject({**narrow, "promote": promote}, "sm_90a")
        keys.add(key_of(variant({**narrow, "promote": promote})))
    assert len(keys) == 7


def test_signature_changing_parameters_change_the_signature_in_the_key():
    base = plan_mod.key_inputs(variant())["signature"]
    for name, value in [("a", "f16"), ("d", "f32"), ("with_c", True), ("a_major", "m"),
                        ("b_major", "n"), ("d_major", "m"), ("rank", 3)]:
        assert plan_mod.key_inputs(variant({**BASE_PARAMS, name: value}))["signature"] != base, name


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a", "sm_90a "])
def test_arch_string_changes_the_key(arch):
    assert key_of(variant(arch=arch)) != key_of(variant())


def test_family_reference_changes_the_key():
    same_class = variant(family="cutlass_aot.kernels.sm90:Sm90GemmFamily")
    assert key_of(same_class) != key_of(variant())


def test_options_change_the_key(monkeypatch):
    base = key_of(variant())
    real = plan_mod.compile_options
    monkeypatch.setattr(plan_mod, "compile_options", lambda arch: real(arch) + " --opt-level 2")
    assert plan_mod.key_inputs(variant())["options"].endswith("--opt-level 2")
    assert key_of(variant()) != base


class _Dist(SimpleNamespace):
    """An installed distribution as importlib.metadata describes it."""


def _dsl_dist_names() -> list[str]:
    return sorted(d.metadata["Name"] for d in md.distributions()
                  if (d.metadata["Name"] or "").lower().startswith("nvidia-cutlass-dsl"))


@pytest.mark.parametrize("dist_name", _dsl_dist_names() + ["nvidia-cutlass-dsl-libs-cu13"])
def test_each_cutlass_dsl_distribution_version_changes_the_key(fresh_toolchain, monkeypatch, dist_name):
    base = key_of(variant())
    real = list(md.distributions())

    def distributions():
        out = []
        for d in real:
            name = d.metadata["Name"] or ""
            if name == dist_name:
                d = _Dist(metadata={"Name": name}, version=d.version + ".post99")
            out.append(d)
        if dist_name not in {d.metadata["Name"] for d in real}:  # a newly installed one
            out.append(_Dist(metadata={"Name": dist_name}, version="4.8.1"))
        return out

    plan_mod.toolchain.cache_clear()
    monkeypatch.setattr(plan_mod.md, "distributions", distributions)
    assert dist_name.lower() in plan_mod.toolchain()["cutlass_dsl"]
    assert key_of(variant()) != base


def test_tvm_ffi_version_changes_the_key(fresh_toolchain, monkeypatch):
    base = key_of(variant())
    real = md.version
    monkeypatch.setattr(plan_mod.md, "version",
                        lambda name: "0.1.16" if name == "apache-tvm-ffi" else real(name))
    plan_mod.toolchain.cache_clear()
    assert plan_mod.toolchain()["tvm_ffi"] == "0.1.16"
    assert key_of(variant()) != base


def test_cutlass_aot_version_changes_the_key(fresh_toolchain, monkeypatch):
    base = key_of(variant())
    monkeypatch.setattr(plan_mod, "__version__", __version__ + ".dev1")
    plan_mod.toolchain.cache_clear()
    assert key_of(variant()) != base


def test_linker_version_changes_the_key(fresh_toolchain, monkeypatch, tmp_path):
    base = key_of(variant())
    other = tmp_path / "gcc-13"
    other.write_text("#!/bin/sh\necho 'gcc (Debian 13.1.0-1) 13.1.0'\n")
    os.chmod(other, 0o755)
    monkeypatch.setattr(plan_mod, "LINKER", str(other))
    plan_mod.toolchain.cache_clear()
    assert plan_mod.toolchain()["linker"] == "gcc (Debian 13.1.0-1) 13.1.0"
    assert key_of(variant()) != base


def test_toolchain_dict_reaches_the_key(fresh_toolchain, monkeypatch):
    base = key_of(variant())
    real = plan_mod.toolchain()
    for field in real:
        changed = dict(real)
        changed[field] = {"x": "1"} if isinstance(real[field], dict) else real[field] + "x"
        monkeypatch.setattr(plan_mod, "toolchain", lambda changed=changed: changed)
        assert key_of(variant()) != base, field


def test_missing_toolchain_parts_are_build_errors(fresh_toolchain, monkeypatch):
    monkeypatch.setattr(plan_mod.md, "distributions", lambda: [])
    with pytest.raises(BuildError, match="nvidia-cutlass-dsl is not installed"):
        plan_mod.toolchain()
    monkeypatch.undo()
    plan_mod.toolchain.cache_clear()
    monkeypatch.setattr(plan_mod, "LINKER", "no-such-linker-q")
    with pytest.raises(BuildError, match="linker"):
        plan_mod.toolchain()


def test_kernel_source_bytes_change_the_key(fresh_toolchain, monkeypatch, tmp_path):
    base = key_of(variant())
    copies = []
    for src in FAMILY.source_files():
        dst = tmp_path / src.name
        shutil.copyfile(src, dst)
        copies.append(dst)
    monkeypatch.setattr(Sm90GemmFamily, "source_files", lambda self: copies)
    plan_mod._sources.cache_clear()
    assert key_of(variant()) == base  # same bytes, same names: same key
    with open(copies[1], "ab") as f:
        f.write(b"\n# one more line\n")
    plan_mod._sources.cache_clear()
    assert key_of(variant()) != base


def test_sources_digest_covers_names_and_bytes(tmp_path, monkeypatch):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_bytes(b"xy")
    b.write_bytes(b"")
    monkeypatch.setattr(Sm90GemmFamily, "source_files", lambda self: [a, b])
    d1 = FAMILY.sources_digest()
    a.write_bytes(b"x")
    b.write_bytes(b"y")  # the same bytes, moved across the file boundary
    d2 = FAMILY.sources_digest()
    assert d2 != d1
    c = tmp_path / "c.py"
    os.rename(b, c)  # same bytes, another name
    monkeypatch.setattr(Sm90GemmFamily, "source_files", lambda self: [a, c])
    assert FAMILY.sources_digest() not in (d1, d2)


def test_sources_digest_monkeypatched_reaches_the_key(fresh_toolchain, monkeypatch):
    base = key_of(variant())
    monkeypatch.setattr(plan_mod, "_sources", lambda ref: "0" * 64)
    assert plan_mod.key_inputs(variant())["sources"] == "0" * 64
    assert key_of(variant()) != base


def test_plan_dedupes_and_keys_match_key_inputs(tmp_path, tiny_manifest):
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415 - local to this test

    m = load_manifest(tiny_manifest)
    jobs = plan_mod.plan([m, m])
    assert len(jobs) == len(m.variants) == 3
    for job in jobs:
        assert job.key == content_key(plan_mod.key_inputs(job.variant))
        assert job.key_inputs == plan_mod.key_inputs(job.variant)
    assert plan_mod.plan([m], arch_filter=("sm_80",)) == []


# ------------------------------------------- environment, link, build side
# Settings the issue found unkeyed, plus LIBS (which runtime is linked) and a
# name the DSL does not have yet: an unknown CUTE_DSL_* setting is keyed too.
@pytest.mark.parametrize("name, value", [
    ("CUTE_DSL_LINEINFO", "1"),
    ("CUTE_DSL_ENABLE_ASSERTIONS", "1"),
    ("CUTE_DSL_COMPILER_OPT", "0"),
    ("CUTE_DSL_ARCH", "sm_90a"),
    ("CUTE_DSL_DEBUG", "1"),
    ("CUTE_DSL_LIBS", "/opt/other/libcute_dsl_runtime.so"),
    ("CUTE_DSL_SOMETHING_NEW", "x"),
    ("CUTE_EXPERIMENTAL_DSL_LINEINFO", "1"),
])
def test_dsl_environment_changes_the_key(monkeypatch, name, value):
    for var in list(os.environ):
        if var.startswith(plan_mod.DSL_ENV_PREFIXES):
            monkeypatch.delenv(var)
    base = key_of(variant())
    monkeypatch.setenv(name, value)
    assert plan_mod.key_inputs(variant())["dsl_env"] == {name: value}
    assert key_of(variant()) != base
    monkeypatch.setenv(name, value + "0")
    assert key_of(variant()) not in (base,)


@pytest.mark.parametrize("name", ["CUTE_DSL_LOG_LEVEL", "CUTE_DSL_DUMP_DIR", "CUTE_DSL_CACHE_DIR"])
def test_dsl_settings_that_cannot_change_bytes_do_not_change_the_key(monkeypatch, name):
    base = key_of(variant())
    monkeypatch.setenv(name, "/tmp/elsewhere" if "DIR" in name else "20")
    assert key_of(variant()) == base


def test_dsl_settings_left_out_of_the_key_are_ones_the_dsl_says_do_not_affect_compile():
    """Every exclusion is checked against the installed DSL's own environment spec."""
    code = (
        "import json, cutlass.cutlass_dsl.cutlass as c, cutlass.base_dsl.env_manager as em\n"
        "specs = [o for o in vars(c).values() if isinstance(o, type) and issubclass(o, em.EnvVarSpec)]\n"
        "out = {}\n"
        "for cls in specs:\n"
        "    for e in cls._ENV_VAR_SPEC:\n"
        "        if isinstance(e.source, str):\n"
        "            out[e.source] = out.get(e.source, False) or e.affects_compile\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    declared = json.loads(proc.stdout.strip().splitlines()[-1])
    assert declared, "the DSL declares no environment settings?"
    compile_affecting = {name for name, affects in declared.items() if affects}
    assert {"LINEINFO", "ENABLE_ASSERTIONS", "COMPILER_OPT", "ARCH", "DEBUG"} <= compile_affecting
    unknown = plan_mod.DSL_ENV_NOT_COMPILE - set(declared)
    assert not unknown, f"excluded from the key but not declared by the DSL: {unknown}"
    wrong = plan_mod.DSL_ENV_NOT_COMPILE & compile_affecting
    assert not wrong, f"excluded from the key but the DSL says they affect compilation: {wrong}"


def test_link_command_reaches_the_key(monkeypatch):
    base = key_of(variant())
    assert plan_mod.key_inputs(variant())["link"][:2] == [plan_mod.LINKER, "-shared"]
    monkeypatch.setattr(plan_mod, "LINK_FLAGS", ("-shared", "-Wl,--build-id=none"))
    assert key_of(variant()) != base
    monkeypatch.setattr(plan_mod, "LINK_FLAGS", ("-shared",))
    monkeypatch.setattr(plan_mod, "LINKER", "clang")
    assert key_of(variant()) != base


def test_compile_stage_links_with_the_keyed_command():
    """compile.py runs plan.link_argv, not a command of its own."""
    from cutlass_aot.builder import compile as compile_mod  # noqa: PLC0415 - local to this test

    assert compile_mod.link_argv is plan_mod.link_argv
    src = Path(compile_mod.__file__).read_text()
    assert "subprocess.run(link_argv(" in src and '"-shared"' not in src


def test_build_side_sources_reach_the_key(monkeypatch, tmp_path):
    here = Path(plan_mod.__file__).parent
    files = [here / n for n in plan_mod.BUILD_SOURCES]
    assert {f.name for f in files} == {"compile.py", "family.py", "plan.py"}
    inputs = plan_mod.key_inputs(variant())
    assert inputs["build_sources"] == files_digest(files)
    # An edit to any of them (say, to the gcc flags in compile.py) changes the digest.
    copies = []
    for f in files:
        shutil.copyfile(f, tmp_path / f.name)
        copies.append(tmp_path / f.name)
    assert files_digest(copies) == inputs["build_sources"]
    for c in copies:
        data = c.read_bytes()
        c.write_bytes(data.replace(b"-shared", b"-shared ", 1) if b"-shared" in data else data + b"#")
        assert files_digest(copies) != inputs["build_sources"]
        c.write_bytes(data)
    base = key_of(variant())
    monkeypatch.setattr(plan_mod, "build_sources_digest", lambda: "1" * 64)
    assert key_of(variant()) != base


def test_narrow_tiles_unswapped_only_from_32_wide_and_swapped_never_clustered_along_n():
    # r27: 32- and 48-wide decode panels build unswapped (tokens on the
    # 64-row M); 16-wide tiles stay swap-AB only. r42: unswapped, such a
    # panel takes clusters along N (the token tile multicast to the weight
    # neighbours); swapped, a tile below 64 wide holds the tokens, and a
    # cluster along N would only multicast the weight over padding.
    for tile in ("64x32", "64x48", "128x48"):
        assert FAMILY.reject({**BASE_PARAMS, "tile": tile}, "sm_90a") is None, tile
    why = FAMILY.reject({**BASE_PARAMS, "tile": "64x16"}, "sm_90a")
    assert why and "swap_ab" in why
    assert FAMILY.reject({**BASE_PARAMS, "tile": "64x16", "swap_ab": True}, "sm_90a") is None
    for cluster in ("1x2", "1x4"):
        assert FAMILY.reject({**BASE_PARAMS, "tile": "64x48", "cluster": cluster}, "sm_90a") is None
    why = FAMILY.reject({**BASE_PARAMS, "tile": "64x48", "cluster": "1x2", "swap_ab": True},
                        "sm_90a")
    assert why and "clusters along M" in why
    assert FAMILY.reject({**BASE_PARAMS, "tile": "128x48", "cluster": "4x1", "swap_ab": True},
                         "sm_90a") is None


# The artifacts' argument order and the dtype widths their alignment checks
# are compiled from, as built under these ABI names. signature.py is not a
# kernel source (it is core code, edited often), so its edits do not change
# keys: this record is the tripwire instead.
RECORDED_ABI = {
    "abis": ("cutlass-aot-gemm-v1", "cutlass-aot-gemm-splitk-v3"),
    "args": {
        (False, False, False): ("a", "b", "d", "alpha", "sm_count"),
        (False, False, True): ("a", "b", "d", "workspace", "alpha", "splits", "sm_count"),
        (False, True, False): ("a", "b", "d", "bias", "alpha", "sm_count"),
        (False, True, True): ("a", "b", "d", "bias", "workspace", "alpha", "splits", "sm_count"),
        (True, False, False): ("a", "b", "d", "c", "alpha", "beta", "sm_count"),
        (True, False, True): ("a", "b", "d", "c", "workspace", "alpha", "beta", "splits", "sm_count"),
        (True, True, False): ("a", "b", "d", "c", "bias", "alpha", "beta", "sm_count"),
        (True, True, True): ("a", "b", "d", "c", "bias", "workspace", "alpha", "beta", "splits",
                             "sm_count"),
    },
    "dtype_bits": {"f16": 16, "bf16": 16, "f32": 32, "e4m3": 8, "e5m2": 8},
}


def test_the_artifact_abi_cannot_change_without_a_new_abi_name():
    """gemm_abi_args orders every artifact's arguments and DTYPE_BITS sets the
    alignment each one checks; neither file is hashed into the keys, but the
    ABI names are (the family's `abi`). Changing either without a new ABI
    name would serve artifacts built to the old order under unchanged keys."""
    from cutlass_aot.layout import GEMM_ABIS  # noqa: PLC0415
    from cutlass_aot.signature import DTYPE_BITS, gemm_abi_args  # noqa: PLC0415

    now = {
        "abis": GEMM_ABIS,
        "args": {(c, b, s): gemm_abi_args(with_c=c, bias=b, split_k=s)
                 for c in (False, True) for b in (False, True) for s in (False, True)},
        "dtype_bits": dict(DTYPE_BITS),
    }
    assert now == RECORDED_ABI, (
        "the GEMM artifact ABI changed: give it new names in layout.py (GEMM_ABI, "
        "GEMM_SPLITK_ABI: they are keyed, so every artifact rebuilds, and a run side refuses "
        "what it does not know), then update RECORDED_ABI here")
