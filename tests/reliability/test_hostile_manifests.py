"""Hostile manifests: generated YAML documents fed to the real loader.

Contract: ``load_manifest`` either returns a Manifest whose variants are all
buildable parameter sets, or raises ManifestError naming the file; nothing
else escapes, and no YAML tag constructs anything.

Documents come from three sources: schema-shaped documents with hostile
values (wrong types, unknown keys, out-of-range values, lists, mappings,
NaN, huge ints, long strings) dumped as block or flow YAML, then mutated at
the text level (inserted YAML punctuation, tags, anchors and aliases,
directives, control characters, deleted spans, duplicated lines); and raw
text from a YAML-heavy alphabet.

A second property aims at inputs that once escaped as other exceptions
(fixed, kept as regressions): explicit ``!!bool``/``!!timestamp``/``!!int``
tags on bad text, a double-quoted ``\\U`` escape past U+10FFFF, and family
references whose module part is empty or relative.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutlass_aot.builder.family import load_family
from cutlass_aot.builder.manifest import Manifest, Variant, load_manifest
from cutlass_aot.errors import ManifestError
from cutlass_aot.kernels.sm90 import Sm90GemmFamily
from tests.families import ToyFamily
from tests.support import record, scaled

ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_90", "SM_90A", ""]
FAMILIES = ["sm90_gemm", "tests.families:ToyFamily", "tests.families:NotAFamily",
            "tests.families:TOY_INSTANCE", "cutlass_aot.kernels.sm90:Sm90GemmFamily", "sm91_gemm",
            "no_such_module_q:Fam", "os:path", "tests.families:Missing", "sm90_gemm:", "x"]
PARAM_NAMES = sorted(set(Sm90GemmFamily.params) | set(ToyFamily.params)) + ["tiles", "", "A", "a "]
ALLOWED = sorted({repr(v): v for fam in (Sm90GemmFamily, ToyFamily)
                  for vs in fam.params.values() for v in vs}.values(), key=repr)
TOP_KEYS = ["arch", "kernels", "description", "kernel", "Arch"]
ENTRY_KEYS = ["family", "params", "name", "skip_unsupported", "parms"]

SAFE_TAGS = ["!!str ", "!!float ", "!!binary ", "!!null ", "!!set ", "!!omap ", "!!pairs ", "!!map ",
             "!!seq ", "!!merge ", "!custom ", "!<tag:yaml.org,2002:str> ",
             "!!python/object:os.system ", "!!python/name:os.system ",
             "!!python/object/apply:os.system ", "!!python/module:os "]
BUGGY_TAGS = ["!!bool ", "!!timestamp ", "!!int "]
PUNCTUATION = [": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "*zz", "\t", "\n", "  ", "? ",
               "| ", "> ", "'", '"', "#", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "---\n", "...\n",
               "<<: *a\n", "\x00", "\ufeff", "\x85", "é", "\\", "@", "`", "~", "=", ".inf", "0x", "0o",
               "1e999", "-.nan", "<BIGINT>"]
BIGINT = "9" * 5000  # past Python's int-from-text digit limit

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.integers(), st.sampled_from(ALLOWED),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
    st.sampled_from(ARCHS), st.sampled_from(FAMILIES),
)
# One level of nesting is enough to reach every branch of the walker, and
# keeps generation cheap (10,000 documents in about a minute here).
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(st.text(max_size=5), scalars, max_size=3),
    st.lists(st.lists(scalars, max_size=2), max_size=2),
)
param_value = st.one_of(st.sampled_from(ALLOWED), st.lists(st.sampled_from(ALLOWED), max_size=3), values)
params = st.dictionaries(st.sampled_from(PARAM_NAMES), param_value, max_size=7)
entry = st.dictionaries(
    st.sampled_from(ENTRY_KEYS),
    st.one_of(st.sampled_from(FAMILIES), params, st.booleans(), values),
    max_size=5,
)
entry_shaped = st.fixed_dictionaries(
    {"family": st.sampled_from(FAMILIES), "params": params},
    optional={"name": values, "skip_unsupported": st.one_of(st.booleans(), values)},
)
document = st.one_of(
    st.fixed_dictionaries(
        {"arch": st.one_of(st.sampled_from(ARCHS), values),
         "kernels": st.one_of(st.lists(st.one_of(entry_shaped, entry, values), max_size=3), values)},
        optional={"description": values, "kernel": values},
    ),
    st.dictionaries(st.sampled_from(TOP_KEYS), values, max_size=4),
    values,
)


def _mutations(snippets: list[str]):
    op = st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 10_000), st.sampled_from(snippets)),
        st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 12)),
        st.tuples(st.just("dup-line"), st.integers(0, 10_000), st.just("")),
    )
    return st.lists(op, max_size=4)


def _apply(text: str, ops) -> str:
    for kind, pos, arg in ops:
        if kind == "insert":
            arg = BIGINT if arg == "<BIGINT>" else arg
            i = pos % (len(text) + 1)
            text = text[:i] + arg + text[i:]
        elif kind == "delete" and text:
            i = pos % len(text)
            text = text[:i] + text[i + arg:]
        elif kind == "dup-line":
            lines = text.splitlines(keepends=True)
            if lines:
                i = pos % len(lines)
                lines.insert(i, lines[i])
                text = "".join(lines)
    return text


def _render(doc, flow: bool) -> str:
    return yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True, sort_keys=False)


raw_text = st.text(alphabet=st.sampled_from(list("abcsm_90a:-[]{},&*!|>'\"#?\n\t .0123456789")), max_size=160)


def documents(snippets: list[str]):
    structured = st.builds(lambda d, flow, ops: _apply(_render(d, flow), ops),
                           document, st.booleans(), _mutations(snippets))
    return st.one_of(structured, structured, raw_text)


def check_contract(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        m = load_manifest(path)
    except ManifestError as exc:
        assert exc.path == str(path) and str(exc).startswith(str(path)), str(exc)
        assert exc.exit_code == 2
        return
    assert isinstance(m, Manifest) and m.variants
    assert m.arch in ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
    seen = set()
    for v in m.variants:
        assert isinstance(v, Variant)
        family = load_family(v.family_ref)
        params = v.param_dict
        assert set(params) == set(family.params)
        for name, value in params.items():
            assert any(value == a and type(value) is type(a) for a in family.params[name]), (name, value)
        assert family.reject(params, m.arch) is None
        assert (v.family_ref, v.params) not in seen
        seen.add((v.family_ref, v.params))


COUNTS = {"main": 0, "bugs": 0}


@pytest.fixture(scope="module")
def doc_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile") / "manifest.yaml"


@pytest.mark.slow
def test_hostile_manifests_raise_only_manifest_error(doc_path):
    n = scaled(10_000)

    @settings(max_examples=n, suppress_health_check=list(HealthCheck))
    @given(text=documents(PUNCTUATION + SAFE_TAGS + BUGGY_TAGS))
    def prop(text):
        COUNTS["main"] += 1
        check_contract(doc_path, text)

    passed = False
    try:
        prop()
        passed = True
    finally:
        record("hostile manifests (hypothesis; load_manifest)", COUNTS["main"], 0 if passed else 1)
    assert COUNTS["main"] >= n, f"only {COUNTS['main']} documents were checked"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_hostile_manifests_aimed_at_past_escapes(doc_path):
    @settings(max_examples=scaled(2_000))
    @given(text=st.one_of(
        documents(PUNCTUATION + SAFE_TAGS + BUGGY_TAGS * 6),
        st.builds(lambda tag, junk: f"arch: {tag}{junk}\nkernels: []\n",
                  st.sampled_from(BUGGY_TAGS), st.text(max_size=5)),
        st.builds(lambda ref: f"arch: sm_90a\nkernels:\n  - family: '{ref}'\n    params: {{}}\n",
                  st.sampled_from([":ToyFamily", ".families:ToyFamily", "..x:Y", ":"])),
        st.builds(lambda cp: f'arch: "\\U{cp:08x}"\nkernels: []\n', st.integers(0x110000, 0xFFFFFFFF)),
    ))
    def prop(text):
        COUNTS["bugs"] += 1
        check_contract(doc_path, text)

    passed = False
    try:
        prop()
        passed = True
    finally:
        record("hostile manifests aimed at past escapes (tags, \\U, family refs)", COUNTS["bugs"],
               0 if passed else 1)
