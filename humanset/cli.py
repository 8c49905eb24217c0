"""`humanset` command line. Each room registers its own subcommands; this file only lists rooms.

Imports are lazy: `humanset --help` does not start Ray, torch or Blender.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from humanset.argparse_compat import command_actions, empty_arguments, hide_command_list

# rooms and their modules exposing register(subparsers); each adds its commands with
# set_defaults(func=...). `humanset --help` lists the commands under these headings.
ROOMS = {
    "start here": ["humanset.demo"],
    "curation (pipeline/)": ["pipeline.cli", "pipeline.select.cli_calibrate"],
    "a run's catalog: statistics, queries, reports, browsing (explore/)": ["explore.cli", "explore.browse.cli"],
    "training (training/)": ["training.cli", "training.tasks.cli", "training.filters.cli"],
    "synthetic humans (render/)": ["render.cli"],
}
COMMAND_MODULES = [m for modules in ROOMS.values() for m in modules]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="humanset",
        description="Build human-centric vision datasets and train on them.\n\n"
                    "Start with `humanset demo` (curates a small crawl made from images that ship "
                    "inside installed packages), then `humanset stats RUN`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="one of the commands below; `humanset COMMAND --help` for its options")
    lines = ["commands, by room:"]
    for room, modules in ROOMS.items():
        before = len(command_actions(sub))
        for name in modules:
            importlib.import_module(name).register(sub)
        lines.append(f"  {room}")
        for action in command_actions(sub)[before:]:
            lines.append(f"    {action.dest:<15} {action.help or ''}")
    hide_command_list(sub)  # listed by room in the epilog instead of one flat list
    parser.epilog = "\n".join(lines)
    return parser


EXIT_USER, EXIT_ENVIRONMENT, EXIT_PIPE_CLOSED = 2, 3, 141  # 141: what a shell shows for a process SIGPIPE ended


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except BrokenPipeError:
        return pipe_closed()
    except SystemExit:  # --help, or argparse's usage error: printed, maybe into a pipe already closed
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise SystemExit(pipe_closed()) from None
        raise


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from catalog.console import native_noise_filtered, setup_logging

    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    empty = empty_arguments(parser, args)
    if empty:  # `--input ""` would otherwise mean the current folder, `query RUN ""` a statement that does nothing
        print(f"humanset {args.command}: error: {', '.join(empty)} is an empty string; pass a value "
              f"(humanset {args.command} --help)", file=sys.stderr)
        return EXIT_USER
    try:
        with native_noise_filtered():
            status = int(args.func(args) or 0)
            sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
            return status
    except BrokenPipeError:
        raise
    except Exception as e:  # the rooms print their own errors; what reaches here is named in one line
        from catalog.storage.answers import store_fault
        fault = store_fault(e)  # the store refused for good, or kept failing: the machine's, exit 3
        status = EXIT_ENVIRONMENT if fault is not None else user_error(e)
        if status is None or args.verbose:
            raise
        command = " ".join([args.command] + [v for k, v in vars(args).items() if k.endswith("_command") and v])
        print(f"humanset {command}: error: {e if fault is None else fault}", file=sys.stderr)
        return status


def user_error(e: Exception) -> int | None:
    """The exit status of an exception that is the user's to fix (a path that is missing or of the wrong
    kind, a folder in use, a file where a folder belongs) or the machine's (a permission); None for
    anything else, which keeps its traceback: that is a bug to report."""
    from catalog.io import RunLocked
    from catalog.run_kind import RunKindError

    if isinstance(e, PermissionError):
        return EXIT_ENVIRONMENT
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError, RunKindError, RunLocked)):
        return EXIT_USER
    return None


def pipe_closed() -> int:
    """`humanset stats RUN | head`: the reader has gone. Stop quietly, as a Unix tool does; what is still
    buffered goes nowhere (Python would otherwise report the pipe again while it exits)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
