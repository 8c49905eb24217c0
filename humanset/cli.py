"""`humanset` command line. Each room registers its own subcommands; this file only lists rooms.

Imports are lazy: `humanset --help` does not start Ray, torch or Blender.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# modules exposing register(subparsers); each adds its commands with set_defaults(func=...)
COMMAND_MODULES = ["humanset.demo", "pipeline.cli", "pipeline.cli_calibrate", "catalog.cli", "training.cli",
                   "training.cli_finetune", "training.cli_filters", "render.cli"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="humanset",
        description="Build human-centric vision datasets and train on them.\n\n"
                    "Start with `humanset demo` (curates a small crawl made from images that ship "
                    "inside installed packages), then `humanset stats RUN`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
