"""`vit-deploy export --help` and docs/command-line.md name every Hugging Face family of the
checkpoint registry (export/checkpoints/hf.py, FAMILIES: the help reads it, the page is
checked against it) and every value --pos-embed and --pool take (runtime/config.py)."""

import re
from pathlib import Path

import click
import pytest

from vit_deploy.cli import main
from vit_deploy.export.checkpoints.hf import FAMILIES
from vit_deploy.runtime.config import POOLS, POS_EMBED_KINDS

ROOT = Path(__file__).resolve().parents[2]
VALUES = {"--pos-embed": POS_EMBED_KINDS, "--pool": POOLS}


def _export():
    ctx = click.Context(main, info_name="vit-deploy")
    command = main.get_command(ctx, "export")
    return command, click.Context(command, info_name="export", parent=ctx)


def _help_of(option: str) -> str:
    """What `export --help` shows for `option`, whitespace joined."""
    command, ctx = _export()
    [param] = [p for p in command.get_params(ctx) if option in getattr(p, "opts", ())]
    return " ".join(" ".join(param.get_help_record(ctx)).split())


def _docs_row(option: str) -> str:
    """The row of docs/command-line.md's export table for `option`."""
    text = (ROOT / "docs" / "command-line.md").read_text()
    section = text.split("### export", 1)[1].split("\n### ", 1)[0]
    [row] = [line for line in section.splitlines() if line.startswith(f"| `{option}")]
    return row


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_of_the_registry_is_named(family):
    shown, row = _help_of("--checkpoint"), _docs_row("--checkpoint")
    for model_type in family.model_types:
        assert re.search(rf"\b{model_type}\b", shown), (model_type, shown)
        assert f"`{model_type}`" in row, (model_type, row)
    assert "{model_types}" not in shown


def test_the_whole_help_renders_the_families_and_the_page_lists_no_others():
    command, ctx = _export()
    page = " ".join(command.get_help(ctx).split())
    listed = [t for f in FAMILIES for t in f.model_types]
    assert ", ".join(listed) in page
    row = _docs_row("--checkpoint")
    named = re.findall(r"`([a-z0-9_]+)`", row.split("model_type", 1)[1].split("(", 1)[0])
    assert named == listed, "docs/command-line.md names the model types in the registry's order"


@pytest.mark.parametrize("option", VALUES)
def test_every_value_of_pos_embed_and_pool_is_in_the_help_and_the_docs(option):
    command, ctx = _export()
    [param] = [p for p in command.get_params(ctx) if option in getattr(p, "opts", ())]
    assert tuple(param.type.choices) == VALUES[option]
    shown, row = _help_of(option), _docs_row(option)
    cell = re.match(r"\| `([^`]*)`", row).group(1)  # "--pool cls\|mean\|map"
    assert tuple(cell.split(" ", 1)[1].replace("\\|", "|").split("|")) == VALUES[option], row
    explained = shown.split("]", 1)[1]  # after the [a|b|c] of the choices
    for value in VALUES[option]:  # each explained, not only listed: "value, what it is"
        assert re.search(rf"\b{value}, ", explained), (option, value, shown)


def test_without_the_export_extra_the_help_points_at_the_docs(monkeypatch):
    from vit_deploy.cli.export import hf_model_types

    monkeypatch.setitem(__import__("sys").modules, "vit_deploy.export.checkpoints.hf", None)
    assert hf_model_types() == "those of docs/checkpoints.md (needs the export extra)"
