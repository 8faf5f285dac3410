"""`dew --version`, and every command's `--help` ending with examples the parser accepts."""

import argparse
import contextlib
import io
import os
import shlex
import subprocess
import sys
from importlib import metadata

import pytest

import dew
from dew.cli import main
from dew.cli._parser import EXAMPLES, _parser


def _commands(parser, words=()):
    """`(words, parser)` for the `dew` parser and every subcommand's, recursively."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands(command, (*words, name))


COMMANDS = dict(_commands(_parser()))


def test_the_walk_finds_every_command():
    names = {" ".join(words) for words in COMMANDS}
    assert {"", "train", "sweep", "eval", "runs", "config", "config show"} <= names


@pytest.mark.parametrize("words", COMMANDS, ids=lambda words: " ".join(("dew", *words)))
def test_every_command_s_help_ends_with_two_or_three_examples(words):
    key = " ".join(words)
    assert key in EXAMPLES, f"dew {key} has no examples: add them to dew.cli._parser.EXAMPLES"
    examples = EXAMPLES[key]
    assert 2 <= len(examples) <= 3
    help_text = COMMANDS[words].format_help()
    # The epilog is the help's end, its lines as written (argparse re-wraps nothing there).
    ending = "\nexamples:\n" + "".join(f"  {line}\n" for line in examples)
    assert help_text.endswith(ending), help_text[-400:]
    assert shlex.split(examples[0], comments=True)[: 1 + len(words)] == ["dew", *words]


@pytest.mark.parametrize(
    "line", [line for lines in EXAMPLES.values() for line in lines], ids=lambda line: line[:60]
)
def test_every_example_is_a_command_line_the_parser_accepts(line):
    argv = shlex.split(line, comments=True)
    if ">" in argv:  # a shell redirection: the command is what comes before it
        argv = argv[: argv.index(">")]
    assert argv[0] == "dew"
    if (argv[1],) not in COMMANDS:
        pytest.skip(f"dew {argv[1]} is another branch's command")
    _parser().parse_args(argv[1:])  # argparse exits (status 2) on a line it refuses


def test_the_examples_keep_their_lines_on_a_narrow_terminal_and_the_rest_wraps(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    parser = dict(_commands(_parser()))[("sweep",)]
    options, examples = parser.format_help().split("\nexamples:\n")
    assert examples == "".join(f"  {line}\n" for line in EXAMPLES["sweep"])
    # A group's description is still argparse's to wrap (a RawDescriptionHelpFormatter's is not).
    description = options.split("(jax.distributed):\n")[1].split("\n\n")[0].splitlines()
    assert len(description) > 5 and max(map(len, description)) <= 40


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"dew {dew.__version__}\n"
    assert dew.__version__ == metadata.version("dew-ml")


def test_dew_version_runs_as_a_command():
    result = subprocess.run(
        [sys.executable, "-m", "dew", "--version"],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, f"dew {dew.__version__}\n", "")


def test_help_of_each_command_runs_through_main():
    for words in COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            main([*words, "--help"])
        assert exit_.value.code == 0 and out.getvalue().rstrip().endswith(
            EXAMPLES[" ".join(words)][-1]
        )
