"""`humanset` command line. Each room registers its own subcommands; this file only lists rooms.

Imports are lazy: `humanset --help` does not start Ray, torch or Blender.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from humanset.argparse_compat import command_actions, hide_command_list

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from catalog.console import native_noise_filtered, setup_logging

    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    with native_noise_filtered():
        try:
            return int(args.func(args) or 0)
        except Exception as e:  # the store refused for good, or kept failing: one line, exit 3
            from catalog.storage.answers import store_fault
            fault = store_fault(e)
            if fault is None:
                raise
            print(f"humanset {args.command}: error: {fault}", file=sys.stderr)
            return 3


if __name__ == "__main__":
    sys.exit(main())
