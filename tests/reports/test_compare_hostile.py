"""`bench --compare` shows a saved report's text as text: terminal escapes (colours, cursor
moves, OSC 8 hyperlinks), other control characters and bidirectional overrides are dropped
when the report is read, and rich markup in it is printed literally, never rendered (a
report could plant a hyperlink in the table)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from vit_deploy.export.bundle import ExportOptions, export_bundle

HOSTILE = {
    "osc8": "cpu\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "colour": "\x1b[31mcpu\x1b[0m\x07\x08",
    "bidi": "cpu\u202egnp.exe",
    "markup": "[link=https://evil.example/]cpu[/link][bold red]x[/]",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory, make_tiny):
    work = tmp_path_factory.mktemp("compare")
    export_bundle(make_tiny(), work / "b", options=ExportOptions(resolution=(32, 32),
                                                                simplify=False))
    out = work / "r.json"
    r = CliRunner().invoke(main, ["bench", str(work / "b"), "--runs", "2", "--warmup", "1",
                                  "--json", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_reports_text_is_shown_as_text(report, tmp_path, kind):
    data = json.loads(json.dumps(report))
    for case in data["cases"]:
        case["provider"] = case["requested"] = HOSTILE[kind]
        case["precision"] = HOSTILE[kind]
    data["environment"]["cpu"] = HOSTILE[kind]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    r = CliRunner().invoke(main, ["bench", "--compare", str(path)], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert not any(ch in r.output for ch in "\x1b\x07\x08\u202e"), repr(r.output[:800])
    if kind == "markup":  # printed as written, not turned into a link or a style
        assert "[link=https://evil.example/]cpu[/link]" in r.output.replace("\n", ""), r.output
