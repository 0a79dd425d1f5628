"""Manifest parsing: expansion to the cartesian product, and every way a
manifest can be wrong, each a ManifestError naming the file, the line, the
field and (where there is a closed set) the allowed values.

Also ``load_family``: builtin names and user ``package.module:Class`` refs.
"""

from __future__ import annotations

import itertools
import math
import pickle
from pathlib import Path

import pytest
import yaml

from cutlass_aot.builder.family import KernelFamily, load_family
from cutlass_aot.builder.manifest import Manifest, Variant, default_manifests, load_manifest
from cutlass_aot.errors import ManifestError
from cutlass_aot.kernels.sm90 import Sm90GemmFamily
from tests.families import TOY_FAILURE, ToyFamily
from tests.support import REPO

GEMM_PARAMS = set(Sm90GemmFamily.params)


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> tuple[ManifestError, Path]:
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    return info.value, path


def assert_located(err: ManifestError, path: Path, line: int | None, field: str | None = None,
                   allowed: list | None = None, *fragments: str) -> None:
    """The error names the file and line (text and data), the field, what is allowed."""
    msg = str(err)
    assert err.path == str(path)
    assert str(path) in msg
    # Errors with no position (empty or unreadable file) carry no line at all.
    assert getattr(err, "line", None) == line, (getattr(err, "line", None), msg)
    if line is not None:
        assert f"{path}:{line}:" in msg
    if field is not None:
        assert err.field == field, (err.data, msg)
        assert field in msg
    if allowed is not None:
        assert list(err.allowed) == list(allowed), err.data
        for value in allowed:
            assert _shown(value) in msg, (value, msg)
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert "Traceback" not in msg


def _shown(value) -> str:
    """How a manifest (YAML) spells an allowed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ------------------------------------------------------------------ expansion
def test_valid_manifest_expands_to_cartesian_product(tmp_path):
    path = write(tmp_path, """\
arch: sm_90a
description: product test
kernels:
  - name: grid
    family: sm90_gemm
    params:
      a: [f16, bf16]
      b_major: [k, n]
      tile: [128x128, 64x128, 128x256]
  - family: sm90_gemm
    params:
      a: f16
      rank: 3
""")
    m = load_manifest(path)
    assert isinstance(m, Manifest)
    assert (m.arch, m.description, m.path) == ("sm_90a", "product test", path)
    assert len(m.variants) == 2 * 2 * 3 + 1
    grid = [v for v in m.variants if v.label == "grid"]
    got = {(v.param_dict["a"], v.param_dict["b_major"], v.param_dict["tile"]) for v in grid}
    want = set(itertools.product(["f16", "bf16"], ["k", "n"], ["128x128", "64x128", "128x256"]))
    assert got == want
    for v in m.variants:
        assert isinstance(v, Variant)
        assert v.family_ref == "sm90_gemm" and v.arch == "sm_90a"
        params = v.param_dict
        assert set(params) == GEMM_PARAMS  # defaults fill everything the entry omits
        for name, value in params.items():
            assert value in Sm90GemmFamily.params[name]
    # Defaults really are the family's defaults.
    assert all(v.param_dict["cluster"] == "1x1" and v.param_dict["with_c"] is False for v in grid)
    assert {v.source for v in grid} == {f"{path}:4"}
    batched = [v for v in m.variants if v.param_dict["rank"] == 3]
    assert len(batched) == 1 and batched[0].source == f"{path}:10"
    assert len({v.params for v in m.variants}) == len(m.variants)


def test_shipped_manifest_expands_to_its_cartesian_products():
    paths = default_manifests()
    shipped = REPO / "configs" / "sm90.yaml"
    assert shipped in paths
    m = load_manifest(shipped)
    # Independent oracle: the product of each entry's list lengths, from plain YAML.
    raw = yaml.safe_load(shipped.read_text())
    expected = sum(math.prod(len(v) if isinstance(v, list) else 1 for v in e["params"].values())
                   for e in raw["kernels"])
    assert len(m.variants) == expected >= 64
    assert len({v.params for v in m.variants}) == expected
    assert not m.skipped
    for path in paths:  # every shipped manifest loads
        assert load_manifest(path).variants


def test_skip_unsupported_drops_rejected_combinations_with_reason(tmp_path):
    path = write(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    skip_unsupported: true
    params:
      a: [f16, bf16]
      b: [f16, bf16]
""")
    m = load_manifest(path)
    assert sorted((v.param_dict["a"], v.param_dict["b"]) for v in m.variants) == [
        ("bf16", "bf16"), ("f16", "f16")]
    assert len(m.skipped) == 2
    assert all("same dtype" in reason for _, reason in m.skipped)


def test_rejected_combination_without_skip_is_an_error(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: f16
      b: bf16
""")
    assert_located(err, path, 3, None, None, "skip_unsupported", "same dtype", "a=f16", "b=bf16")
    assert err.field == "params"


@pytest.mark.parametrize("params, reason", [
    ("{a: bf16, pingpong: true, split_k: true}", "pingpong does not combine with split_k"),
    ("{a: bf16, pingpong: true, tile: 128x256}", "pingpong warpgroup holds the whole tile"),
    ("{a: bf16, k_cluster: 2}", "use a tile of at most 128x64"),
    ("{a: bf16, tile: 128x64, k_cluster: 4, cluster: 2x1}", "set cluster 1x1, not 2x1"),
    ("{a: bf16, tile: 128x64, k_cluster: 3, split_k: true}", "does not combine with split_k or pingpong"),
    ("{a: bf16, tile: 128x64, k_cluster: 2, pingpong: true}", "does not combine with split_k or pingpong"),
    ("{a: bf16, pingpong: true, tile: 192x128}", "pingpong warpgroup holds the whole tile"),
    ("{a: bf16, tile: 192x128, k_cluster: 2}", "use a tile of at most 128x64"),
    ("{a: bf16, promote: 16}", "promote keeps a second fp32 copy of the accumulators (128 a thread here)"),
    ("{a: bf16, tile: 128x128, promote: 4}", "(128 a thread here)"),
    ("{a: bf16, tile: 128x64, promote: 8, pingpong: true}", "promote does not combine with pingpong"),
])
def test_schedule_combinations_it_cannot_run_are_errors(tmp_path, params, reason):
    err, path = error_of(tmp_path, f"""\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params: {params}
""")
    assert_located(err, path, 3, None, None, reason)


def test_a_192_row_tile_wider_than_192_is_refused(tmp_path):
    # Three warpgroups of 64x208 would need 104 accumulators in one wgmma,
    # past the 128 registers ptxas allows a 512-thread kernel's instructions.
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params: {a: bf16, tile: 192x208}
""")
    assert_located(err, path, 4, None, None, "'192x208' is not allowed", "192x192")


def test_k_cluster_variants_load(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("""\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params: {a: bf16, swap_ab: true, tile: [64x16, 128x64], k_cluster: [2, 3, 4]}
""")
    m = load_manifest(path)
    assert sorted((v.param_dict["tile"], v.param_dict["k_cluster"]) for v in m.variants) == [
        ("128x64", 2), ("128x64", 3), ("128x64", 4), ("64x16", 2), ("64x16", 3), ("64x16", 4)]


# --------------------------------------------------------------------- errors
def test_unknown_top_level_key(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernel:
  - family: sm90_gemm
    params: {a: bf16}
""")
    assert_located(err, path, 2, "kernel", ["arch", "description", "kernels", "tune", "tuning"], "unknown key")


def test_unknown_entry_key(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    parms: {a: bf16}
""")
    assert_located(err, path, 4, "parms", ["family", "name", "params", "skip_unsupported"])


def test_unknown_param(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      tiles: 128x128
""")
    assert_located(err, path, 6, "tiles", sorted(GEMM_PARAMS), "unknown key 'tiles'")


def test_missing_required_param_names_allowed_values(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      tile: 128x128
""")
    assert_located(err, path, 5, "a", ["f16", "bf16"], "missing 'a'")


@pytest.mark.parametrize(
    "text, line, field, fragment",
    [
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: [a, bf16]\n",
         4, "params", "params must be a mapping, not a list"),
        ("arch: [sm_90a]\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n",
         1, "arch", "arch must be a single value, not a list"),
        ("arch: sm_90a\nkernels:\n  family: sm90_gemm\n",
         3, "kernels", "kernels must be a non-empty list"),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    skip_unsupported: yes please\n"
         "    params: {a: bf16}\n", 4, "skip_unsupported", "true or false"),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    name: [x]\n    params: {a: bf16}\n",
         4, "name", "name must be a single value"),
        ("arch: sm_90a\ndescription: 12\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n",
         2, "description", "description must be text"),
        ("arch: sm_90a\nkernels:\n  - family: 7\n    params: {a: bf16}\n",
         3, "family", "family must be a name"),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params:\n      a: {x: 1}\n",
         5, "params.a", "must be a single value, not a mapping"),
        ("- arch: sm_90a\n", 1, "the manifest", "the manifest must be a mapping, not a list"),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params:\n      1: bf16\n",
         5, "params", "key 1 must be a string"),
    ],
    ids=["params-list", "arch-list", "kernels-mapping", "skip-text", "name-list",
         "description-int", "family-int", "param-mapping", "root-list", "int-key"],
)
def test_wrong_type(tmp_path, text, line, field, fragment):
    err, path = error_of(tmp_path, text)
    assert_located(err, path, line, field, None, fragment)


@pytest.mark.parametrize(
    "value, shown",
    [("f8", "'f8'"), ("[bf16, f8]", "'f8'"), ("fp16", "'fp16'"), ("null", "None")],
)
def test_unsupported_value_lists_allowed_values(tmp_path, value, shown):
    err, path = error_of(tmp_path, f"""\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: {value}
""")
    assert_located(err, path, 5, "a", ["f16", "bf16"], f"params.a: {shown} is not allowed",
                   "allowed: f16, bf16")


def test_int_given_as_string_is_not_allowed(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      swizzle: "2"
""")
    assert_located(err, path, 6, "swizzle", [1, 2, 4, 8], "'2' is not allowed")


def test_value_listed_twice(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: [bf16,
          bf16]
""")
    assert_located(err, path, 6, "a", None, "listed twice")


def test_empty_value_list(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: []
""")
    assert_located(err, path, 5, "a", ["f16", "bf16"], "empty list")


@pytest.mark.parametrize(
    "text, line, field",
    [
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params:\n      a: bf16\n"
         "      tile: 128x128\n      a: f16\n", 7, "a"),
        ("arch: sm_90a\narch: sm_90a\nkernels: []\n", 2, "arch"),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    family: sm90_gemm\n"
         "    params: {a: bf16}\n", 4, "family"),
    ],
    ids=["param", "top", "entry"],
)
def test_duplicate_yaml_key(tmp_path, text, line, field):
    err, path = error_of(tmp_path, text)
    assert_located(err, path, line, field, None, f"duplicate key '{field}'")


def test_a_builtin_family_named_by_its_module_path_is_the_builtin(tmp_path):
    """`cutlass_aot.kernels.sm90:Sm90GemmFamily` is sm90_gemm: one variant
    spelled both ways is a duplicate (it was two keys, the same kernel built
    twice), and the module path plans to the builtin's keys, whose records
    and table rows name `sm90_gemm`."""
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params: {a: bf16, tile: 128x128}
  - family: cutlass_aot.kernels.sm90:Sm90GemmFamily
    params: {a: bf16, tile: 128x128}
""")
    assert_located(err, path, 5, None, None, "duplicate variant", f"also produced by {path}:3")
    from cutlass_aot.builder.plan import plan  # noqa: PLC0415

    short = load_manifest(write(tmp_path, "arch: sm_90a\nkernels:\n  - family: sm90_gemm\n"
                                          "    params: {a: bf16, tile: 128x128}\n", "s.yaml"))
    long = load_manifest(write(tmp_path, "arch: sm_90a\nkernels:\n  - family: "
                                         "cutlass_aot.kernels.sm90:Sm90GemmFamily\n"
                                         "    params: {a: bf16, tile: 128x128}\n", "l.yaml"))
    assert [j.key for j in plan([short])] == [j.key for j in plan([long])]
    assert long.variants[0].family_ref == "sm90_gemm"


def test_duplicate_variant_across_entries(tmp_path):
    # The second entry spells out the default tile: the same variant.
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: [bf16, f16]
  - family: sm90_gemm
    params:
      a: bf16
      tile: 128x256
""")
    assert_located(err, path, 6, None, None, "duplicate variant", "a=bf16", "tile=128x256",
                   f"also produced by {path}:3")
    assert err.field == "params"


@pytest.mark.parametrize("text", ["arch: sm_90a\nkernels: []\n", "arch: sm_90a\nkernels:\n"])
def test_empty_kernels(tmp_path, text):
    err, path = error_of(tmp_path, text)
    assert_located(err, path, 2, "kernels", None, "non-empty list")


def test_missing_kernels(tmp_path):
    err, path = error_of(tmp_path, "arch: sm_90a\ndescription: nothing\n")
    assert_located(err, path, 1, "kernels", None, "missing required key 'kernels'")


def test_missing_arch(tmp_path):
    err, path = error_of(tmp_path, """\
kernels:
  - family: sm90_gemm
    params: {a: bf16}
""")
    assert_located(err, path, 1, "arch", None, "missing required key 'arch'")


@pytest.mark.parametrize("arch", ["sm_91", "sm90a", "SM_90A", "hopper", "90"])
def test_unknown_arch(tmp_path, arch):
    err, path = error_of(tmp_path, f"""\
# a comment line first
arch: {arch}
kernels:
  - family: sm90_gemm
    params: {{a: bf16}}
""")
    assert_located(err, path, 2, "arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a"],
                   "is not a known target")


def test_known_arch_the_family_does_not_build(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_80
kernels:
  - family: sm90_gemm
    params: {a: bf16}
""")
    assert_located(err, path, 3, "family", None, "builds for sm_90a, not sm_80")


def test_unknown_family(tmp_path):
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm91_gemm
    params: {a: bf16}
""")
    assert_located(err, path, 3, "family", None, "unknown kernel family 'sm91_gemm'", "sm90_gemm",
                   "package.module:Class")


def test_the_shipped_gemv_family_by_its_short_name_gets_its_path(tmp_path):
    """README has a gemv section, but the family has no short name: the error
    says which module path to write (r50 review)."""
    err, path = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: gemv
    params: {a: bf16}
""")
    assert "unknown kernel family 'gemv'" in err.message
    assert "family: cutlass_aot.kernels.gemv:GemvFamily" in err.message


@pytest.mark.parametrize(
    "ref, fragment",
    [
        ("no_such_package_q.kernels:Fam", "cannot import module 'no_such_package_q.kernels'"),
        ("os:path", "is not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:NotAFamily", "is not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:TOY_INSTANCE", "is not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:Missing", "is not a cutlass_aot.builder.family.KernelFamily subclass"),
    ],
)
def test_bad_family_reference(tmp_path, ref, fragment):
    err, path = error_of(tmp_path, f"""\
arch: sm_90a
kernels:
  - family: "{ref}"
    params: {{x: 1}}
""")
    assert_located(err, path, 3, "family", None, fragment, ref)


@pytest.mark.parametrize(
    "key, value, allowed",
    [("rank", "true", [2, 3]), ("rank", "[2, false]", [2, 3]), ("swizzle", "true", [1, 2, 4, 8]),
     ("with_c", "1", [False, True]), ("with_c", "0", [False, True])],
)
def test_bool_is_not_int_and_int_is_not_bool(tmp_path, key, value, allowed):
    err, path = error_of(tmp_path, f"""\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      {key}: {value}
""")
    shown = ", ".join(_shown(v) for v in allowed)
    assert_located(err, path, 6, key, allowed, "is not allowed", f"allowed: {shown}")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(tmp_path, text):
    err, path = error_of(tmp_path, text)
    assert_located(err, path, None, None, None, "manifest is empty", "'arch'", "'kernels'")


def test_empty_document_marker(tmp_path):
    err, path = error_of(tmp_path, "---\n")
    assert_located(err, path, 2, "the manifest", None, "must be a mapping")


@pytest.mark.parametrize(
    "text, line",
    [
        ("arch: sm_90a\nkernels: [\n", 3),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n   params: {a: bf16}\n", 4),
        ("arch: sm_90a\nkernels:\n  - family: 'sm90_gemm\n", 4),
        ("arch: sm_90a\n\tkernels: []\n", 2),
        ("arch: *nowhere\n", 1),
    ],
    ids=["unclosed-flow", "bad-indent", "unclosed-quote", "tab", "undefined-alias"],
)
def test_invalid_yaml_syntax(tmp_path, text, line):
    err, path = error_of(tmp_path, text)
    assert_located(err, path, line, None, None, "not valid YAML")


def test_missing_and_unreadable_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ManifestError, match="no such manifest file") as info:
        load_manifest(missing)
    assert info.value.path == str(missing)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"arch: \xff\xfe\x00sm_90a\n")
    with pytest.raises(ManifestError, match="cannot read manifest") as info:
        load_manifest(binary)
    assert str(binary) in str(info.value)


@pytest.mark.parametrize(
    "text, line",
    [
        ("arch: !!python/name:os.system sm_90a\nkernels: []\n", 1),
        ("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params:\n"
         "      a: !!python/object/apply:os.system MARKER\n", 5),
        ("arch: sm_90a\nkernels:\n  - family: !!python/object/new:tests.families.ToyFamily x\n"
         "    params: {x: 1}\n", 3),
    ],
    ids=["name-tag-arch", "apply-tag-param", "new-tag-family"],
)
def test_python_tags_are_refused_and_never_run(tmp_path, text, line):
    marker = tmp_path / "pwned"
    err, path = error_of(tmp_path, text.replace("MARKER", f"touch {marker}"))
    assert_located(err, path, line, None, None, "cannot read value", "python/")
    assert not marker.exists()


def test_python_tag_on_a_collection_constructs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    err, path = error_of(tmp_path, f"""\
arch: !!python/object/apply:os.system ["touch {marker}"]
kernels: []
""")
    assert_located(err, path, 1, "arch", None, "arch must be a single value")
    assert not marker.exists()


@pytest.mark.parametrize("tagged", ["!!bool foo", "!!timestamp foo", "!!int ''"])
def test_explicit_core_tags_with_bad_text_are_manifest_errors(tmp_path, tagged):
    path = write(tmp_path, f"arch: {tagged}\nkernels: []\n")
    try:
        load_manifest(path)
    except ManifestError as exc:
        assert_located(exc, path, 1, "arch", None, "cannot read value")
    except Exception as exc:  # noqa: BLE001 - the point: nothing but ManifestError
        raise AssertionError(f"{type(exc).__name__}: {exc} escaped load_manifest") from exc
    else:
        raise AssertionError("accepted")


def test_out_of_range_unicode_escape_is_a_manifest_error(tmp_path):
    path = write(tmp_path, 'arch: "\\U00110000"\nkernels: []\n')
    try:
        load_manifest(path)
    except ManifestError as exc:
        assert_located(exc, path, 1, None, None, "not valid YAML")
    except Exception as exc:  # noqa: BLE001 - the point: nothing but ManifestError
        raise AssertionError(f"{type(exc).__name__}: {exc} escaped load_manifest") from exc
    else:
        raise AssertionError("accepted")


def test_manifest_error_pickles_with_its_data(tmp_path):
    err, path = error_of(tmp_path, "arch: sm_90a\nkernels:\n  - family: sm90_gemm\n"
                                   "    params:\n      a: f8\n")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is ManifestError
    assert (str(clone), clone.path, clone.line, clone.field, clone.allowed) == (
        str(err), str(path), 5, "a", ["f16", "bf16"])
    assert clone.exit_code == 2


# ---------------------------------------------------------------- user family
def test_load_family_builtin_and_user_class():
    assert isinstance(load_family("sm90_gemm"), Sm90GemmFamily)
    assert isinstance(load_family("cutlass_aot.kernels.sm90:Sm90GemmFamily"), Sm90GemmFamily)
    fam = load_family("tests.families:ToyFamily")
    assert isinstance(fam, ToyFamily) and isinstance(fam, KernelFamily)


@pytest.mark.parametrize(
    "ref, fragment",
    [
        ("tests.families:NotAFamily", "not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:TOY_INSTANCE", "not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:TOY_FAILURE", "not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.families:Nope", "not a cutlass_aot.builder.family.KernelFamily subclass"),
        ("tests.no_such_module:ToyFamily", "cannot import module 'tests.no_such_module'"),
        ("toy", "unknown kernel family 'toy'"),
    ],
)
def test_load_family_rejects_what_is_not_a_family(ref, fragment):
    with pytest.raises(ManifestError, match="kernel family") as info:
        load_family(ref)
    assert fragment in str(info.value)
    assert info.value.field == "family"


@pytest.mark.parametrize("ref", [":ToyFamily", ".families:ToyFamily", "..x:Y"])
def test_load_family_malformed_module_name_is_a_manifest_error(ref):
    try:
        load_family(ref)
    except ManifestError as exc:
        assert exc.field == "family"
    except Exception as exc:  # noqa: BLE001 - the point: nothing but ManifestError
        raise AssertionError(f"{type(exc).__name__}: {exc} escaped load_family") from exc
    else:
        raise AssertionError(f"{ref!r} was accepted")


def test_user_family_in_a_manifest(tmp_path):
    path = write(tmp_path, """\
arch: sm_90a
kernels:
  - family: tests.families:ToyFamily
    skip_unsupported: true
    params:
      x: [1, 2, 3]
      mode: [fast, slow]
""")
    m = load_manifest(path)
    assert sorted((v.param_dict["x"], v.param_dict["mode"]) for v in m.variants) == [
        (1, "fast"), (1, "slow"), (2, "fast"), (2, "slow")]
    assert {v.family_ref for v in m.variants} == {"tests.families:ToyFamily"}
    assert [reason for _, reason in m.skipped] == ["x=3 needs a wider register file"] * 2
    assert TOY_FAILURE  # the family used by the build-failure tests is this one


def test_tune_and_tuning_sections_are_validated(tmp_path):
    """`tune:` problems parse at load; a bad group or a missing table file is a ManifestError."""
    good = tmp_path / "good.yaml"
    (tmp_path / "t.json").write_text("{}")
    good.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n"
                    "tune:\n  - a: bf16\n    m: [1, 8]\n    nk: [[4096, 4096]]\ntuning: t.json\n")
    m = load_manifest(good)
    assert len(m.tune) == 2 and m.tunings == [(tmp_path / "t.json").resolve()]
    # a list: one table per GPU, in order
    (tmp_path / "u.json").write_text("{}")
    listed = tmp_path / "listed.yaml"
    listed.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n"
                      "tuning: [t.json, u.json]\n")
    assert load_manifest(listed).tunings == [(tmp_path / n).resolve() for n in ("t.json", "u.json")]
    for value, message in [("[]", "a list of them"), ("[t.json, 3]", "a list of them"),
                           ("[t.json, [u.json]]", "must be a single value, not a list"),
                           ("[t.json, nowhere.json]", "nowhere.json does not exist")]:
        listed.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n"
                          f"tuning: {value}\n")
        with pytest.raises(ManifestError, match=message) as err:
            load_manifest(listed)
        assert err.value.line == 5 and err.value.field == "tuning", value
    bad = tmp_path / "bad.yaml"
    bad.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n"
                   "tune:\n  - a: f32\n    shapes: [[1, 2, 3]]\n")
    with pytest.raises(ManifestError, match="a must be f16 or bf16"):
        load_manifest(bad)
    missing = tmp_path / "missing.yaml"
    missing.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n"
                       "tuning: nowhere.json\n")
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(missing)



def test_shipped_selection_tables_bind_to_the_shipped_manifest():
    """Every row of configs/sm90.yaml's tables (the H200's, and since r61 the
    H100's) names a variant that configs/sm90.yaml builds, at the kernel
    sources it was measured on. Editing sm90_gemm's sources, or dropping a
    variant a row names, fails here: re-run `cutlass-aot tune
    configs/sm90.yaml` on that GPU and ship its `--out` table (the cache
    would otherwise drop those rows). The H200's covers every problem of the
    tune: section but r64's residual ones and r72's transformers-Llama
    widths (both tuned on an H100 only); the H100's only problems of that
    section outside the long-K order, whose burst timings the power cap
    overturns (r53)."""
    from cutlass_aot import tables  # noqa: PLC0415
    from cutlass_aot.builder.plan import plan  # noqa: PLC0415
    from cutlass_aot.layout import is_sha256  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415

    manifest = load_manifest(REPO / "configs" / "sm90.yaml")
    docs = [tables.load_table_file(f) for f in manifest.tunings]
    assert [d["gpu"] for d in docs] == [
        {"name": "NVIDIA H200", "sm_count": 132, "capability": "9.0"},
        {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "capability": "9.0"}]
    # Plan only (no compile): every row must bind by its kernel sources, as it
    # will on a CI machine whatever its toolchain. After a kernel-source edit
    # that keeps the code byte-identical, build_scripts/restamp_table.py
    # re-states the rows against a rebuild instead of a GPU re-tune.
    jobs = plan([manifest])
    entries = [(j.signature.text(), j.variant.family_ref, j.variant.param_dict, j.key_inputs["sources"],
                None) for j in jobs]
    sigs = {j.signature for j in jobs}
    wanted = set()
    for prob in manifest.tune:
        a, b, d, a_major, b_major, d_major, rank = prob.layout
        want = next(s for s in sigs if dict(s.fields) == {
            "a": a, "b": b, "d": d, "c": prob.c, "a_major": a_major, "b_major": b_major,
            "d_major": d_major, "rank": rank, "align": 16,
            **({"bias": prob.bias} if prob.bias else {}),
            **({"act": prob.act} if prob.act != "none" else {})})
        wanted.add((want.text(), *prob.dims))
    for table in docs:
        _, counts = tables.bind(table["rows"], entries)
        assert counts == {"used": len(table["rows"]), "same_bytes": 0, "missing_variant": 0,
                          "stale_source": 0}, table["gpu"]
        assert all(is_sha256(r.get("artifact")) for r in table["rows"]), \
            "every shipped row names the artifact it timed (restamp_table.py needs it)"
    h200, h100 = ({(r["signature"], r["m"], r["n"], r["k"], r["l"]) for r in t["rows"]} for t in docs)
    # r64's residual problems (with C; r66 added 160 and 288 tokens): tuned on an H100 only, so far (but
    # for the long-K order's, below)
    residual = {w for w in wanted if ",c=-," not in w[0]}
    in_order = {w for w in wanted if select.longk_applies(w[1], w[2], w[3], w[4])}
    assert len(residual) == 120 and residual - in_order <= h100 and not residual & h200
    # r72: transformers' Llama projects k/v (1024) and gate/up (14336) one by one, and its LM head
    # past 2048 tokens; tuned on an H100 only, so far
    hf = {w for w in wanted - residual
          if w[2:4] in ((1024, 4096), (14336, 4096)) or (w[2:4] == (128256, 4096) and w[1] > 2048)}
    assert len(hf) == 64 and hf <= h100 and not hf & h200
    assert not wanted - residual - hf - h200, sorted(wanted - residual - hf - h200)[:5]
    assert {w[1:] for w in h200 - wanted} == {(1024, 1024, 1024, 1)}  # r32's two extra rows
    assert h100 <= wanted, sorted(h100 - wanted)[:5]
    assert in_order and not h100 & in_order
    assert len(h100) >= 300


def test_a_yaml_merge_key_is_named_and_an_alias_of_a_whole_value_works(tmp_path):
    """r51: `<<: *defaults` under params said "cannot read value '<<' (tag
    tag:yaml.org,2002:merge): ConstructorError"."""
    err, _ = error_of(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params: &d
      a: bf16
      tile: [128x128]
  - family: sm90_gemm
    params:
      <<: *d
      tile: [128x256]
""")
    assert err.line == 9 and "YAML merge keys ('<<') are not read" in err.message, err.message
    path = write(tmp_path, """\
arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: bf16
      tile: &t [128x128]
  - family: sm90_gemm
    params:
      a: f16
      tile: *t
""", name="alias.yaml")
    assert len(load_manifest(path).variants) == 2


def test_a_piped_manifest_reads_a_relative_tuning_path_from_the_working_dir(tmp_path, monkeypatch):
    """r51 review: a pipe's directory (/dev/fd, /proc/<pid>/fd) means nothing,
    and `tuning: t.json` piped in was looked for there."""
    import os  # noqa: PLC0415

    (tmp_path / "t.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    r, w = os.pipe()
    os.write(w, b"arch: sm_90a\ntuning: t.json\nkernels:\n  - family: sm90_gemm\n    params: {a: bf16}\n")
    os.close(w)
    try:
        m = load_manifest(f"/dev/fd/{r}")
    finally:
        os.close(r)
    assert m.tunings == [tmp_path / "t.json"]


def test_shipped_manifest_builds_each_long_k_walk_with_its_band():
    """select's long-K order takes 256x192's 1x2 walk in bands (swizzle 8)
    before its plain walk (r59), and the band's split-K form in its place
    where the last wave is mostly idle (r60). Wherever configs/sm90.yaml
    builds the plain walk (a layout, dtype and side), it builds the band and
    its split form too, or that call layout would silently run the plain
    walk (up to 7% slower at long K) or the whole band (up to 13% slower on
    a mostly idle last wave)."""
    from cutlass_aot.run import select  # noqa: PLC0415

    band = next(w for w in select.LONGK_WALKS if w[2] != 1)
    assert band in select.LONGK_SPLIT_WALKS
    forms: dict[tuple, set[tuple[int, bool]]] = {}
    for v in load_manifest(REPO / "configs" / "sm90.yaml").variants:
        p = v.param_dict
        if (p.get("tile"), p.get("cluster"), p.get("raster")) != (f"{band[0]}x{band[1]}", "1x2", "m") \
                or p.get("pingpong") or int(p.get("k_cluster", 1)) != 1:
            continue
        layout = tuple(sorted((k, str(val)) for k, val in p.items() if k not in ("swizzle", "split_k")))
        forms.setdefault(layout, set()).add((int(p.get("swizzle", 1)), bool(p.get("split_k"))))
    plain = [layout for layout, z in forms.items() if (1, False) in z]
    assert plain, "the shipped manifest lost the long-K walk"
    missing = [(dict(layout), form) for layout in plain for form in ((band[2], False), (band[2], True))
               if form not in forms[layout]]
    assert not missing, missing


def test_the_shipped_configs_plan_fewer_variants_than_builds_default_limit(monkeypatch):
    """The README's first command builds configs/ with no --yes: its plan must
    stay within the default --max-variants (1,008 of 2,000 at r64; the
    default was 1,000 until the shipped plan grew past it), or that
    command exits 2. Adding variants past it means raising the default, with
    the README's knob table and docs/cli.md."""
    from cutlass_aot import knobs  # noqa: PLC0415

    monkeypatch.delenv("CUTLASS_AOT_MAX_VARIANTS", raising=False)
    planned = sum(len(load_manifest(p).variants) for p in default_manifests())
    assert 1000 < planned <= knobs.max_variants() == 2000, planned
