"""Every `coevolve ...` command that README.md and docs/*.md show exists, with every flag it uses.

Commands are taken from fenced code blocks (a line, after any `VAR=value` assignments, that runs
`coevolve` or a path ending in `/coevolve`; `\\` continues a line) and from inline code spans that
start with `coevolve `. Each command's subcommand path must resolve in the Typer app and answer
`--help`; each `--flag` (or `-f`) token it shows must be an option of that command. Optional parts
written as `[--flag X]`, alternatives as `a|b` and placeholders as `<...>`, `N`, `FILE` are allowed:
only flags and subcommand names are checked.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from coevolve.services.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
PLACEHOLDER = re.compile(r"<[^<>]*>")
ANY_VALUE = "__placeholder__"  # what a `<...>` stands for once the line is split


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    text: str

    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}: {self.text}"


def _command_start(text: str) -> str | None:
    """The text from `coevolve` on, when this shell line runs coevolve (after env assignments)."""
    words = text.strip().split()
    i = 0
    while i < len(words) and ASSIGNMENT.match(words[i]):
        i += 1
    if i < len(words) and (words[i] == "coevolve" or words[i].endswith("/coevolve")):
        return "coevolve " + " ".join(words[i + 1:])
    return None


def examples_in(path: Path) -> list[Example]:
    found: list[Example] = []
    fenced = False
    pending: tuple[int, str] | None = None  # a fenced command continued with a backslash
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            fenced, pending = not fenced, None
            continue
        if fenced:
            if pending is not None:
                start, text = pending
                text = f"{text} {line.strip()}"
            else:
                command = _command_start(line)
                if command is None:
                    continue
                start, text = number, command
            if text.rstrip().endswith("\\"):
                pending = (start, text.rstrip()[:-1].rstrip())
            else:
                pending = None
                found.append(Example(path, start, text))
            continue
        for match in SPAN.finditer(line):
            span = match.group(2).strip()
            if span.startswith("coevolve "):
                found.append(Example(path, number, span))
    return found


ALL_EXAMPLES = [example for path in DOCS for example in examples_in(path)]


def _tokens(example: Example) -> list[str]:
    text = PLACEHOLDER.sub(ANY_VALUE, example.text)
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=False)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)
    except ValueError as exc:  # unbalanced quotes
        pytest.fail(f"{example.where()}\n  cannot be split as a shell line: {exc}")


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")  # Typer vendors its own click: no isinstance against click's classes


def _options(command: Any) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for param in command.params:
        for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            names[name] = param
    names.setdefault("--help", None)
    return names


def _leaves(group: Any) -> list[Any]:
    return [leaf for cmd in group.commands.values() for leaf in (_leaves(cmd) if _is_group(cmd) else [cmd])]


def resolve(example: Example) -> tuple[tuple[str, ...], dict[str, Any], list[str]]:
    """The subcommand path, the options it takes, and the flags the example gives it.

    Fails on an unknown subcommand. A placeholder where a subcommand goes (`coevolve <service>`)
    stands for any command under the group resolved so far: its flags must belong to one of them."""
    tokens = _tokens(example)
    assert tokens and tokens[0] == "coevolve", example.where()
    command: Any = get_command(app)
    path: list[str] = []
    rest = tokens[1:]
    while _is_group(command):
        options = _options(command)
        if not rest:
            break
        token = rest[0].strip("[]()")
        if token == ANY_VALUE:
            options = {name: param for leaf in _leaves(command) for name, param in _options(leaf).items()}
            return tuple(path), options, _flags(rest[1:])
        if token.startswith("-"):  # an option of the group itself, e.g. --log-level
            flag = token.split("=", 1)[0]
            assert flag in options, (f"{example.where()}\n  `coevolve {' '.join(path)}` has no option "
                                     f"{flag}; it has {', '.join(sorted(options))}")
            param = options[flag]
            takes_value = param is not None and not getattr(param, "is_flag", False) and "=" not in token
            rest = rest[2:] if takes_value else rest[1:]
            continue
        assert token in command.commands, (
            f"{example.where()}\n  `coevolve {' '.join(path)}` has no subcommand {token!r}; it has "
            f"{', '.join(sorted(command.commands))}")
        path.append(token)
        command = command.commands[token]
        rest = rest[1:]
    return tuple(path), _options(command), _flags(rest)


def _flags(tokens: list[str]) -> list[str]:
    """The `--flag` and `-f` words among the tokens, `[--a X|--b]` and `--flag=value` included."""
    flags = []
    for token in tokens:
        for part in token.strip("[](),").split("|"):
            part = part.strip("[](),")
            if re.match(r"^--?[A-Za-z]", part):
                flags.append(part.split("=", 1)[0])
    return flags


def test_the_docs_show_commands():
    shown = {resolve(example)[0] for example in ALL_EXAMPLES}
    assert ("run",) in shown and len(ALL_EXAMPLES) > 20, [e.where() for e in ALL_EXAMPLES]


def test_every_leaf_command_is_listed_in_the_readme():
    def leaves(group: Any, prefix: tuple[str, ...] = ()):
        for name, cmd in group.commands.items():
            yield from leaves(cmd, prefix + (name,)) if _is_group(cmd) else [prefix + (name,)]

    listed = {resolve(e)[0] for e in ALL_EXAMPLES if e.path.name == "README.md"}
    missing = [" ".join(p) for p in leaves(get_command(app)) if p not in listed]
    assert not missing, f"README.md shows no example of: {', '.join(missing)}"


@pytest.mark.parametrize("example", ALL_EXAMPLES, ids=lambda e: f"{e.path.name}:{e.line}")
def test_documented_command_exists_with_its_flags(example):
    path, options, flags = resolve(example)
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, f"{example.where()}\n  `coevolve {' '.join(path)} --help` failed:\n{result.output}"
    unknown = [flag for flag in flags if flag not in options]
    assert not unknown, (f"{example.where()}\n  `coevolve {' '.join(path)}` has no option "
                         f"{', '.join(unknown)}; it has {', '.join(sorted(options))}")


@pytest.mark.parametrize("text, problem", [
    ("coevolve frobnicate --steps 3", "no subcommand 'frobnicate'"),
    ("coevolve topics delete", "no subcommand 'delete'"),
    ("coevolve run --preset smoke --no-such-flag", "no option --no-such-flag"),
    ("coevolve replay [--window N|--bogus]", "no option --bogus"),
])
def test_a_bad_example_fails_naming_file_and_line(text, problem):
    example = Example(ROOT / "README.md", 7, text)
    with pytest.raises(AssertionError) as failure:
        path, options, flags = resolve(example)
        unknown = [flag for flag in flags if flag not in options]
        assert not unknown, f"{example.where()}\n  no option {', '.join(unknown)}"
    assert "README.md:7" in str(failure.value) and problem in str(failure.value)


def test_extraction_reads_fences_continuations_and_spans(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `coevolve eval --limit 4` or `make run`.\n"
                    "```bash\n"
                    "OPENAI_API_KEY=x coevolve run --preset smoke \\\n"
                    "    --steps 2   # a comment --not-a-flag\n"
                    "kubectl -n coevolve get pods\n"
                    "```\n"
                    "`coevolve.signals` is a topic.\n")
    found = [(e.line, e.text) for e in examples_in(page)]
    assert found == [(1, "coevolve eval --limit 4"), (3, "coevolve run --preset smoke --steps 2   # a comment --not-a-flag")]
    assert resolve(Example(page, 3, found[1][1]))[2] == ["--preset", "--steps"]
