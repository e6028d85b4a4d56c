"""One option vocabulary across the command line (docs/command-line.md, "One vocabulary"):
each concept has one spelling in every command and one shape (--json [FILE], --quiet / -q,
--provider, --precision with its names); every option says what it takes; every command's
help ends with a runnable example; every command that prints has --quiet, and --quiet and
--json alone really keep stdout to the result; an unknown option that is another tool's
word for ours is answered with ours; and a missing or unreadable input named on the command
line exits 2 with one line in every command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vit_deploy.cli import main
from vit_deploy.cli import params as cli_params
from vit_deploy.cli import vocabulary as cli_vocabulary
from vit_deploy.runtime.contract import PRECISIONS

ROOT = Path(__file__).resolve().parents[2]

# concept -> (the one spelling, other spellings that must never be options of ours)
CONCEPTS = {
    "provider": ("--provider", {"--providers", "--ep", "--execution-provider", "--device",
                                "--backend"}),
    "json": ("--json", {"--json-out", "--json-file", "--output-json", "--as-json"}),
    "quiet": ("--quiet", {"--silent", "--no-progress", "-s"}),
    "res": ("--res", {"--resolution", "--resolutions", "--size", "--sizes", "--img-size",
                      "--image-size", "--input-size"}),
    "out": ("--out", {"--output", "--output-dir", "--out-dir", "--outdir", "-o"}),
    "force": ("--force", {"--overwrite", "--yes", "-f", "-y"}),
    "threads": ("--threads", {"--thread", "--num-threads", "--jobs", "-j"}),
    "precision": ("--precision", {"--precisions", "--dtype", "--quant"}),
    "batch": ("--batch", {"--batch-size", "--batches", "--bs"}),
    "target": ("--target", {"--targets"}),
}
# An old spelling kept as the second name of the same option, in the commands that had it.
OLD = {"--providers": ("--provider", {"check", "bench"})}
SHORT = {"-q": "--quiet", "-h": "--help"}  # the only one-letter options
SILENT: set[str] = set()  # commands that print nothing, so need no --quiet: none

# Values for required options, so that only the input named on the command line is wrong.
REQUIRED = {"--precision": "int8", "--target": "cpu", "--buckets": "224", "--out": "{tmp}/out"}
# Inputs given by option rather than argument (commands without a BUNDLE argument).
INPUT_OPTIONS = {"export": "--checkpoint"}


def run(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _commands() -> list[tuple[str, click.Command, click.Context]]:
    ctx = click.Context(main, info_name="vit-deploy")
    out = []
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        out.append((name, command, click.Context(command, info_name=name, parent=ctx)))
    return out


COMMANDS = [name for name, _, _ in _commands()]


def _options(command: click.Command, ctx: click.Context) -> list[click.Option]:
    return [p for p in command.get_params(ctx) if isinstance(p, click.Option)
            and "--help" not in p.opts]


def _names(option: click.Option) -> list[str]:
    return [*option.opts, *option.secondary_opts]


def _stem(name: str) -> str:
    return name.lstrip("-").replace("-", "").replace("_", "").rstrip("s")


# -- one spelling, one shape --------------------------------------------------------------
def test_each_concept_has_one_spelling_across_commands():
    others = {o: concept for concept, (_, spellings) in CONCEPTS.items() for o in spellings}
    problems = []
    stems: dict[str, set[str]] = {}
    for name, command, ctx in _commands():
        for option in _options(command, ctx):
            for i, opt in enumerate(_names(option)):
                if opt in OLD:
                    ours, where = OLD[opt]
                    if name not in where or option.opts[0] != ours:
                        problems.append(f"{name}: {opt} is the old spelling of {ours}: only a "
                                        f"second name of {ours}, only in {sorted(where)}")
                    continue
                if opt in others:
                    concept = others[opt]
                    problems.append(f"{name}: {opt} is a second spelling of {concept}: "
                                    f"{CONCEPTS[concept][0]}")
                if not opt.startswith("--"):
                    if SHORT.get(opt) not in option.opts:
                        problems.append(f"{name}: {opt}: the only short options are {SHORT}")
                    continue
                stems.setdefault(_stem(opt), set()).add(opt)
    problems += [f"one concept, several spellings: {sorted(s)}" for s in stems.values()
                 if len(s) > 1]
    assert not problems, "\n".join(problems)


def test_shared_options_have_one_shape_everywhere():
    problems = []
    for name, command, ctx in _commands():
        for option in _options(command, ctx):
            first = option.opts[0]
            if first == "--json" and not (not option.is_flag and option.flag_value == "-"
                                          and option.metavar == "[FILE]"):
                problems.append(f"{name} --json: not --json [FILE] (alone: stdout)")
            if first == "--quiet" and not (option.is_flag and "-q" in option.opts):
                problems.append(f"{name} --quiet: not a flag with -q")
            if first == "--force" and not option.is_flag:
                problems.append(f"{name} --force: not a flag")
            if first == "--out" and (option.is_flag or not isinstance(option.type, click.Path)):
                problems.append(f"{name} --out: not a path")
            if first == "--provider" and (option.is_flag or option.default != "cpu"):
                problems.append(f"{name} --provider: not a value defaulting to cpu")
            if first == "--precision":
                known = (isinstance(option.type, click.Choice)
                         and tuple(option.type.choices) == PRECISIONS) or isinstance(
                    option.type, cli_params.PrecisionList)
                if not known:
                    problems.append(f"{name} --precision: not checked against {PRECISIONS}")
    assert not problems, "\n".join(problems)


def test_the_suggestion_table_names_only_our_spellings():
    ours = {o for _, command, ctx in _commands() for option in _options(command, ctx)
            for o in _names(option)}
    for other, spelling in cli_vocabulary.SYNONYMS.items():
        assert spelling in ours, (other, spelling)
        assert other not in ours or other in OLD, f"{other} is an option: not a synonym"
    for concept, (spelling, others) in CONCEPTS.items():
        for other in others & set(cli_vocabulary.SYNONYMS):
            assert cli_vocabulary.SYNONYMS[other] == spelling, (concept, other)
    assert set(cli_vocabulary.VOCABULARY.values()) <= ours
    assert {spelling for spelling, _ in CONCEPTS.values()} == set(
        cli_vocabulary.VOCABULARY.values()), "this table and vocabulary.VOCABULARY disagree"


@pytest.mark.parametrize("command,typed,ours", [
    ("predict", "--resolution", "--res"), ("export", "--size", "--res"),
    ("bench", "--resolutions", "--res"), ("predict", "--providers", "--provider"),
    ("serve", "--execution-provider", "--provider"), ("export", "--output", "--out"),
    ("triton", "-o", "--out"), ("check", "--precisions", "--precision"),
    ("bench", "--batch-size", "--batch"), ("web", "--overwrite", "--force"),
    ("predict", "--resolution=64", "--res"),
])
def test_an_unknown_option_that_means_one_of_ours_names_ours(command, typed, ours):
    r = run(command, typed, "x")
    assert r.exit_code == 2, r.output
    assert f"Did you mean '{ours}'?" in r.output, r.output
    assert "--precision'?" not in r.output or ours == "--precision"


# -- help ---------------------------------------------------------------------------------
def test_every_option_says_what_it_takes():
    problems = []
    for name, command, ctx in _commands():
        for option in _options(command, ctx):
            if not (option.help or "").strip():
                problems.append(f"{name} {option.opts[0]}: no help")
                continue
            shown = " ".join(" ".join(option.get_help_record(ctx) or ("", "")).split())
            values: tuple[str, ...] = ()
            if isinstance(option.type, click.Choice):
                values = tuple(map(str, option.type.choices))
            elif option.opts[0] == "--precision":
                values = PRECISIONS
            elif isinstance(option.type, click.IntRange) and option.type.min is not None \
                    and option.type.max is not None:
                values = (str(option.type.min), str(option.type.max))
            missing = [v for v in values if v not in shown]
            if missing:
                problems.append(f"{name} {option.opts[0]}: the help does not list {missing}")
            if option.opts[0] in ("--json", "--markdown", "--csv", "--plot") \
                    and "FILE" not in shown:
                problems.append(f"{name} {option.opts[0]}: the help does not say FILE")
    assert not problems, "\n".join(problems)


def _example(command: click.Command) -> str:
    m = re.search(r"^\s*\x08\s*\n\s*Example:\s*\n\s*(vit-deploy .+)$", command.help or "", re.M)
    assert m, f"no '\\b' paragraph with 'Example:' and a vit-deploy line: {command.help!r}"
    return m.group(1).split(" | ")[0]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_commands_help_ends_with_a_runnable_example(name, monkeypatch):
    """The example parses: its options exist and its values are valid (inputs named in it
    are placeholders: not checked for existence here)."""
    ctx = click.Context(main, info_name="vit-deploy")
    command = main.get_command(ctx, name)
    words = _example(command).split()
    assert words[:2] == ["vit-deploy", name], words
    monkeypatch.setattr(cli_params, "unreadable", lambda path: None)
    sub = command.make_context(name, words[2:], parent=ctx)  # raises on anything wrong
    assert sub.params
    text = command.get_help(click.Context(command, info_name=name, parent=ctx))
    assert f"Example:\n    vit-deploy {name}" in text, text  # \b kept the line as written


def test_every_command_that_prints_has_quiet():
    missing = [name for name, command, ctx in _commands() if name not in SILENT
               and not any(o.opts[0] == "--quiet" for o in _options(command, ctx))]
    assert not missing, f"commands that print but have no --quiet: {missing}"


# -- inputs named on the command line ------------------------------------------------------
def _args_with_missing_input(name: str, tmp_path: Path, missing: Path) -> list[str] | None:
    ctx = click.Context(main, info_name="vit-deploy")
    command = main.get_command(ctx, name)
    args = [str(missing) for p in command.params if isinstance(p, click.Argument)]
    if not args and name in INPUT_OPTIONS:
        args = [INPUT_OPTIONS[name], str(missing)]
    if not args:
        return None
    for p in command.params:
        if isinstance(p, click.Option) and p.required:
            assert p.opts[0] in REQUIRED, f"{name} {p.opts[0]}: add a value to REQUIRED"
            args += [p.opts[0], REQUIRED[p.opts[0]].format(tmp=tmp_path)]
    return args


@pytest.mark.parametrize("name", COMMANDS)
def test_a_missing_input_exits_2_with_one_line(name, tmp_path):
    missing = tmp_path / "no-such-bundle"
    args = _args_with_missing_input(name, tmp_path, missing)
    if args is None:
        assert name == "providers", f"{name}: which input does it take? (INPUT_OPTIONS)"
        return  # takes no input
    r = run(name, *args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert str(missing) in lines[0] and "does not exist" in lines[0], lines
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in INPUT_OPTIONS
                                  and n != "providers"])
def test_an_unreadable_input_exits_2_with_one_line(name, tmp_path, monkeypatch):
    bundle = tmp_path / "b"
    bundle.mkdir()
    args = _args_with_missing_input(name, tmp_path, bundle)
    monkeypatch.setattr(cli_params.os, "access", lambda *a, **k: False)
    r = run(name, *args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert str(bundle) in lines[0] and "cannot be read" in lines[0], lines


# -- what --quiet and --json alone leave on stdout -----------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny bundle written by `export --quiet` (which prints only its path), an image."""
    t = tmp_path_factory.mktemp("vocabulary")
    bundle = t / "b"
    r = run("export", "--model", "tiny", "--res", "32", "--no-simplify", "--out", bundle, "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"{bundle}\n", r.stdout  # no table, no banner: the path written
    image = t / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    return bundle, image


BENCH = ["--runs", "1", "--warmup", "0", "--sessions", "1"]


@pytest.mark.parametrize("args", [
    ["info", "{b}"], ["providers"], ["predict", "{b}", "{i}", "--top-k", "2"],
    ["check", "{b}", "--batch", "1"], ["bench", "{b}", *BENCH],
], ids=["info", "providers", "predict", "check", "bench"])
def test_json_alone_is_all_there_is_on_stdout(world, args):
    b, i = world
    args = [a.format(b=b, i=i) for a in args]
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)  # nothing but the JSON: it pipes
    assert isinstance(data, dict) and data
    r = run(*args, "--json", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout).keys() == data.keys()
    assert r.stderr == "", r.stderr  # --quiet: no progress either


@pytest.mark.parametrize("args,lines", [
    (["info", "{b}"], 0), (["check", "{b}", "--batch", "1"], 0),
    (["bench", "{b}", *BENCH], 0), (["predict", "{b}", "{i}", "--top-k", "3"], 3),
], ids=["info", "check", "bench", "predict"])
def test_quiet_prints_only_the_result(world, args, lines):
    b, i = world
    r = run(*[a.format(b=b, i=i) for a in args], "-q")
    assert r.exit_code == 0, r.output
    assert r.stderr == "", r.stderr
    out = r.stdout.splitlines()
    assert len(out) == lines, r.stdout
    for rank, line in enumerate(out, 1):  # predict: image, rank, class, label, probability
        source, k, index, _label, p = line.split("\t")
        assert (source, int(k)) == (str(i), rank) and int(index) >= 0 and 0 <= float(p) <= 1


def test_quiet_providers_and_triton_print_their_one_result(world, tmp_path):
    b, _ = world
    r = run("providers", "-q")
    assert r.exit_code == 0 and "cpu" in r.stdout.split(), r.output
    r = run("triton", b, "--out", tmp_path / "repo", "--name", "tiny", "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"{tmp_path / 'repo'}/tiny\n", r.stdout


def test_json_file_is_written_and_the_usual_output_kept(world, tmp_path):
    b, i = world
    out = tmp_path / "p.json"
    r = run("predict", b, i, "--json", out)
    assert r.exit_code == 0, r.output
    assert "ran on cpu" in r.stdout and json.loads(out.read_text())["providers"] == ["cpu"]
    r = run("info", b, "--json", tmp_path / "m.json", "-q")
    assert r.exit_code == 0 and r.stdout == "", r.output
    assert json.loads((tmp_path / "m.json").read_text())["format"] == "vit-deploy-bundle"


def test_json_does_not_take_an_image_for_its_file(world, tmp_path):
    """`predict B --json dog.png cat.png`: dog.png is read as --json's FILE; it exists and is
    not JSON, so nothing is written over it."""
    b, i = world
    dog = tmp_path / "dog.png"
    dog.write_bytes(i.read_bytes())
    r = run("predict", b, "--json", dog, i)
    assert r.exit_code == 2 and "put --json last" in r.output, r.output
    assert dog.read_bytes() == i.read_bytes()
    r = run("info", b, "--json", b / "info.json")
    assert r.exit_code == 2 and "inside the bundle" in r.output, r.output


def test_precision_is_one_of_the_known_names(world):
    b, i = world
    r = run("predict", b, i, "--precision", "int9")
    assert r.exit_code == 2, r.output
    assert all(p in r.output for p in PRECISIONS) and "quantize" not in r.output, r.output
    r = run("predict", b, i, "--precision", "fp16")  # a real precision the bundle lacks
    assert r.exit_code == 2 and "vit-deploy quantize --precision fp16" in r.output, r.output


def test_providers_is_still_accepted_by_check_and_bench(world):
    b, _ = world
    r = run("check", b, "--providers", "cpu", "--batch", "1", "-q")
    assert r.exit_code == 0, r.output
    r = run("bench", b, "--providers", "cpu", *BENCH, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout), r.output


# -- documented once ---------------------------------------------------------------------
ALSO_DOCUMENTED = {"export": ("quantize",)}  # export --precision takes quantize's options


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^#+ {re.escape(heading)}\s*$(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert m, f"docs/command-line.md has no section {heading!r}"
    return m.group(1)


def test_the_docs_show_the_vocabulary_once_and_every_option_of_every_command():
    text = (ROOT / "docs" / "command-line.md").read_text()
    table = _section(text, "One vocabulary")
    for concept, spelling in cli_vocabulary.VOCABULARY.items():
        assert re.search(rf"^\| {re.escape(concept)} \| `{re.escape(spelling)}[ `]", table,
                         re.M), f"the vocabulary table has no row for {concept} ({spelling})"
    assert text.count("## One vocabulary") == 1
    problems = []
    for name, command, ctx in _commands():
        section = "".join(_section(text, s) for s in (name, *ALSO_DOCUMENTED.get(name, ())))
        for option in _options(command, ctx):
            if not re.search(rf"`{re.escape(option.opts[0])}[ `\]]", section):
                problems.append(f"{name}: {option.opts[0]} is not in its section")
    assert not problems, "\n".join(problems)
