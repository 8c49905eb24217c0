"""humanset/argparse_compat.py against the running Python's argparse: fails when the private list
of commands it reads and empties changes."""
import argparse
import sys

import pytest

from humanset import argparse_compat


def test_python_is_a_tested_version():
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert version in argparse_compat.TESTED_PYTHON, (f"Python {version}: humanset/argparse_compat.py was "
                                                      f"tested on {argparse_compat.TESTED_PYTHON}")


def test_commands_are_listed_in_order_and_hidden_from_help_but_still_parse():
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("first", help="the first command")
    sub.add_parser("second", help="the second command")
    actions = argparse_compat.command_actions(sub)
    assert [(a.dest, a.help) for a in actions] == [("first", "the first command"), ("second", "the second command")]
    assert "the first command" in parser.format_help()
    argparse_compat.hide_command_list(sub)
    assert "the first command" not in parser.format_help() and "second" not in parser.format_help()
    assert parser.parse_args(["second"]).command == "second"
    with pytest.raises(SystemExit):
        parser.parse_args(["third"])


def test_the_humanset_help_lists_each_command_once(capsys):
    from humanset.cli import build_parser
    text = build_parser().format_help()
    head, rooms = text.split("commands, by room:")
    names = [line.split()[0] for line in rooms.splitlines() if line.startswith("    ")]
    assert names.count("curate") == 1 and not [line for line in head.splitlines() if line.split()[:1] == ["curate"]]
