"""Every command's --help: each flag has a help text and states its default at most once; an empty --api-key
(an unset variable) is an error, never a server without a key."""

from __future__ import annotations

import argparse

import pytest

from geopilot.cli import _Parser, main, walk


def _options(parser: argparse.ArgumentParser, where: str):
    for action in parser._actions:
        assert not isinstance(action, argparse._SubParsersAction), f"{where}: subcommands go in a COMMANDS table"
        if action.option_strings and action.dest != "help":
            yield where, action, parser


COMMANDS = [(prog, holder) for prog, _, holder in walk()]


@pytest.mark.parametrize(("prog", "holder"), COMMANDS, ids=[prog for prog, _ in COMMANDS])
def test_every_flag_has_help_and_one_default(prog, holder):
    parser = _Parser(prog=prog)
    holder.add_arguments(parser)
    for where, action, owner in _options(parser, prog):
        assert action.help, f"{where} {action.option_strings}: no help text"
        shown = owner.formatter_class("x")._get_help_string(action)
        assert shown.count("default:") <= 1, (where, shown)


@pytest.mark.parametrize("argv", [["serve", "--model", "m"], ["mcp", "--transport", "http"]])
def test_an_empty_api_key_is_an_error(argv, capsys):
    assert main([*argv, "--api-key", ""]) == 2
    assert "--api-key is empty" in capsys.readouterr().err


def test_the_old_tools_yaml_flag_name_still_works_and_says_the_new_one(capsys):
    from geopilot.tools.registry import DEFAULT_CONFIG

    assert main(["tools", "list", "--json", "--config", str(DEFAULT_CONFIG)]) == 0
    assert "--config is deprecated, use --tools-config" in capsys.readouterr().err
