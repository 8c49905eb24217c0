"""The one use of argparse's private API in humanset: the list of a subparsers action's commands
that `--help` prints (`_SubParsersAction._choices_actions`), read to list commands by room and
emptied so they are listed once, in the epilog.

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
