"""The README's documented exit codes, run against the real CLI.

The README's "exit-codes" table lists commands with placeholders and the
exit code each must give; every row runs here in a subprocess. A row that
drifts from the CLI fails this test.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.support import REPO, artifact, flip_byte, run_cli, subprocess_env

TABLE = re.compile(r"<!-- exit-codes: checked by tests/test_readme.py -->\n(.*?)<!-- /exit-codes -->", re.S)
ROW = re.compile(r"^\| `(?P<cmd>[^`]+)` \| (?P<code>\d) \|$")


def documented_rows() -> list[tuple[str, int]]:
    match = TABLE.search((REPO / "README.md").read_text())
    assert match, "README.md lost its exit-codes table"
    rows = [(m["cmd"], int(m["code"])) for line in match.group(1).splitlines() if (m := ROW.match(line))]
    assert len(rows) >= 10, rows
    return rows


def test_the_table_covers_every_documented_code():
    codes = {code for _, code in documented_rows()}
    assert codes == {0, 1, 2}


@pytest.mark.parametrize("command, code", documented_rows())
def test_documented_exit_code(command, code, built_cache, cache_copy, tmp_path):
    flip_byte(artifact(cache_copy, built_cache.keys[0]))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.json").write_text(json.dumps({"format": "something-else"}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("arch: sm_90a\nkernels:\n  - family: sm90_gemm\n    params: {a: f8}\n")
    places = {
        "<cache>": built_cache.path, "<corrupted cache>": cache_copy, "<missing dir>": tmp_path / "missing",
        "<foreign dir>": foreign, "<bad manifest>": bad, "<manifest>": built_cache.manifest,
        "<new dir>": tmp_path / "new",
    }
    for name, path in places.items():
        command = command.replace(name, shlex.quote(str(path)))
    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    assert words[0] == "cutlass-aot", command
    proc = run_cli(*words[1:], env=subprocess_env(**env))
    assert proc.returncode == code, (command, proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]


def test_the_shipped_manifest_count_matches_the_readme():
    """README's "builds N variants (G of `sm90_gemm`, V of `gemv`)" is what
    configs/sm90.yaml expands to: it read 536 for five rounds of new tiles."""
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415

    text = " ".join((REPO / "README.md").read_text().split())
    match = re.search(r"\(configs/sm90\.yaml\) builds (\d+) variants \((\d+) of `sm90_gemm`, (\d+) of `gemv`\)",
                      text)
    assert match, "README.md lost the shipped manifest's variant count"
    variants = load_manifest(REPO / "configs" / "sm90.yaml").variants
    gemm = sum(1 for v in variants if v.family_ref == "sm90_gemm")
    gemv = sum(1 for v in variants if v.family_ref.endswith(":GemvFamily"))
    assert (int(match[1]), int(match[2]), int(match[3])) == (len(variants), gemm, gemv)


def _readme_value(text: str) -> str:
    return text.strip().strip("`")


def test_the_sm90_parameter_table_lists_what_the_family_takes():
    """README's sm90_gemm parameter table (Manifest) names every value and the
    default of each parameter the family takes: its tile row missed 256x176
    when the tile list grew."""
    from cutlass_aot.kernels.sm90 import Sm90GemmFamily  # noqa: PLC0415

    def spelled(value) -> str:
        if value is None:
            return "null"
        return str(value).lower() if isinstance(value, bool) else str(value)

    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `k_cluster` |"))
    while lines[start - 1].startswith("|"):
        start -= 1
    rows = {}
    for line in lines[start:]:
        if not line.startswith("| `"):
            if not line.startswith("|"):
                break
            continue
        cells = line.split(" | ")
        rows[_readme_value(cells[0].lstrip("| "))] = (
            [_readme_value(v) for v in cells[1].split(",")], _readme_value(cells[2]))
    params, defaults = Sm90GemmFamily.params, Sm90GemmFamily.defaults
    assert set(rows) == set(params)
    for name, values in params.items():
        listed, default = rows[name]
        assert listed == [spelled(v) for v in values], name
        assert default == (spelled(defaults[name]) if name in defaults else "(required)"), name
