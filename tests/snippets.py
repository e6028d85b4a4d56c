"""The code in a Markdown page, read as a reader meets it: every fenced or indented block in
order, and in each the command lines, the Python, the JavaScript, or what it only shows (a
listing, a command's output, a JSON excerpt). tests/test_tour.py and
tests/test_docs_snippets.py run what this gives; it runs nothing itself.

A block it cannot read as one of those raises `Unclassified`, so a page cannot gain code a
test silently passes over."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

# Words that start a command line in the docs (besides anything else on PATH)
COMMANDS = ("vit-deploy", "python", "node", "make", "sudo", "apt-get", "cd", "npm", "docker",
            "cat", "jq", "pip")
_ASSIGN = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")  # HF_HUB_OFFLINE=1 vit-deploy ...
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
_LANGS = {"python": "python", "py": "python", "js": "js", "javascript": "js", "mjs": "js",
          "html": "html", "json": "shown", "text": "shown", "yaml": "shown", "toml": "shown"}
_SHELL = ("", "indented", "bash", "sh", "shell", "console")


class Unclassified(ValueError):
    """A block, or a line in one, that is neither code this module knows nor a listing."""


@dataclass(frozen=True)
class Block:
    lang: str   # the fence's language; '' for a bare fence, 'indented' for an indented block
    text: str
    line: int   # the page's line (1-based) of the block's first line of code


@dataclass(frozen=True)
class Snippet:
    kind: str     # 'shell' (one command line), 'python', 'js', 'html' or 'shown'
    text: str     # a command: continuations joined, a trailing comment dropped
    line: int
    output: str = ""  # after a `$ ` prompt: the lines the page shows the command printing


def code_blocks(text: str) -> list[Block]:
    """Fenced blocks (their indent inside a list item removed) and indented code blocks: 4+
    spaces after a blank line, outside a list (a list item's indented paragraphs and tables
    are prose, as Markdown reads them)."""
    lines = text.split("\n")
    out: list[Block] = []
    i, prev_blank, in_list = 0, True, False
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            indent, mark = len(fence.group(1)), fence.group(2)
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(mark):
                j += 1
            body = [raw[indent:] if not raw[:indent].strip() else raw.lstrip()
                    for raw in lines[i + 1:j]]
            out.append(Block(fence.group(3).lower(), "\n".join(body), i + 2))
            i, prev_blank = j + 1, False
            continue
        if not line.strip():
            i, prev_blank = i + 1, True
            continue
        if _LIST_ITEM.match(line):
            in_list = True
        elif not line[0].isspace():
            in_list = False  # a paragraph, heading or table at the margin ends a list
        if prev_blank and line.startswith("    ") and not in_list:
            j, body = i, []
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            out.append(Block("indented", "\n".join(body), i + 1))
            i = j
            continue
        i, prev_blank = i + 1, False
    return out


def is_command(line: str) -> bool:
    """A shell command line: it starts (after VAR=value assignments) with a word of COMMANDS
    or a program on PATH."""
    words = _ASSIGN.sub("", line.strip()).split()
    return bool(words) and (words[0] in COMMANDS or (
        words[0] not in ("[",) and shutil.which(words[0]) is not None))


def _drop_comment(cmd: str) -> str:
    return re.sub(r"\s+#.*$", "", cmd).strip()


def _shell(block: Block) -> list[Snippet]:
    lines = block.text.split("\n")
    if any(line.startswith("$ ") for line in lines):  # prompts, each followed by its output
        out, i = [], 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                if out:
                    out[-1] = Snippet("shell", out[-1].text, out[-1].line,
                                      (out[-1].output + "\n" + lines[i]).strip("\n"))
                elif lines[i].strip():
                    raise Unclassified(f"line {block.line + i}: output before any command")
                i += 1
                continue
            start, cmd = i, lines[i][2:]
            while cmd.rstrip().endswith("\\"):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
            out.append(Snippet("shell", _drop_comment(cmd), block.line + start))
            i += 1
        return out
    first = next((line for line in lines if line.strip()), "")
    if not is_command(first):
        if block.lang not in ("", "indented"):
            raise Unclassified(f"line {block.line}: a ```{block.lang} block that is no command")
        return [_shown(block)]
    out, continues = [], False
    for n, raw in enumerate(lines):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continues = False
            continue
        if out and (continues or (raw[:1].isspace() and stripped.startswith(("[", "--")))):
            # a continuation: after a backslash, or a synopsis's indented [--option ...] line
            prev = out[-1]
            joined = prev.text.rstrip("\\").rstrip() + " " + _drop_comment(stripped.rstrip("\\"))
            out[-1] = Snippet("shell", joined.strip(), prev.line)
        elif is_command(stripped):
            out.append(Snippet("shell", _drop_comment(stripped.rstrip("\\")), block.line + n))
        else:
            raise Unclassified(f"line {block.line + n}: {stripped!r} in a block of commands is "
                               "neither a command nor a continuation of one")
        continues = stripped.endswith("\\")
    return out


def _shown(block: Block) -> Snippet:
    """A listing or output: no line of it may be a command, which would then never run."""
    for n, raw in enumerate(block.text.split("\n")):
        if is_command(raw):
            raise Unclassified(f"line {block.line + n}: {raw.strip()!r} is a command inside a "
                               "listing: put it in a block of its own")
    return Snippet("shown", block.text, block.line)


def snippets(text: str) -> list[Snippet]:
    """A page's code in order: one Snippet per command line, Python / JS / HTML block, and
    shown block (a ```json or ```text block, a file tree, output without a prompt)."""
    out: list[Snippet] = []
    for block in code_blocks(text):
        kind = _LANGS.get(block.lang)
        if kind == "shown":
            out.append(Snippet("shown", block.text, block.line))
        elif kind:
            out.append(Snippet(kind, block.text, block.line))
        elif block.lang in _SHELL:
            out += _shell(block)
        else:
            raise Unclassified(f"line {block.line}: a ```{block.lang} block")
    return out
