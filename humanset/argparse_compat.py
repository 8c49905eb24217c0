"""The one use of argparse's private API in humanset: the list of a subparsers action's commands
that `--help` prints (`_SubParsersAction._choices_actions`), read to list commands by room and
emptied so they are listed once, in the epilog; and a parser's arguments (`ArgumentParser._actions`),
read to name an argument given an empty string.

Tested on the argparse of Python 3.11 to 3.13 (same attribute since Python 3.2).
tests/test_argparse_compat.py fails when a Python version changes it.
"""
from __future__ import annotations

import argparse

TESTED_PYTHON = ("3.11", "3.12", "3.13")


def command_actions(sub: argparse._SubParsersAction) -> list[argparse.Action]:
    """The commands added to `sub` so far, in order, each with its `dest` (name) and `help`."""
    return list(sub._choices_actions)


def hide_command_list(sub: argparse._SubParsersAction) -> None:
    """Leave the commands out of `--help`'s list of choices (they still parse)."""
    sub._choices_actions.clear()


def empty_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The arguments of the command `args` chose that were given an empty string (`--input ""`), by
    their flag or their metavar; an empty value is never a path, a query or a setting."""
    names, seen = [], set()
    while parser is not None:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
                continue
            value = getattr(args, action.dest, None)
            empty = value == "" or (isinstance(value, list) and "" in value)
            if empty and action.dest not in seen:
                seen.add(action.dest)
                names.append(action.option_strings[-1] if action.option_strings else
                             (action.metavar if isinstance(action.metavar, str) else action.dest.upper()))
        parser = chosen
    return names
