"""The shipped YAML files of every room's settings, written from the rooms' config dataclasses (the only
place a default is written; docs/config.md). The front knows every room, so the list lives here:

    python -m humanset.settings_files --write     # after changing a setting(): rewrite the YAMLs
    python -m humanset.settings_files --check     # exit 1 naming each stale file (tests/test_config_files.py)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generated() -> dict[str, str]:
    """Each shipped settings YAML (path relative to the repository) and the text it must hold."""
    from catalog.config import to_yaml
    from pipeline.settings import HEADER, CurateSettings
    from training import config as training

    out = {"pipeline/default.yaml": to_yaml(CurateSettings, HEADER)}
    for command, name in training.YAML.items():
        out[f"training/{name}"] = to_yaml(training.config_class(command), training.header(command),
                                          training.YAML_COLUMN)
    return out


def stale(root: Path = ROOT) -> list[str]:
    return [path for path, text in generated().items()
            if not (root / path).is_file() or (root / path).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m humanset.settings_files", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="rewrite every stale settings YAML")
    g.add_argument("--check", action="store_true", help="exit 1 when a settings YAML is stale")
    args = p.parse_args(argv)
    files = generated()
    bad = stale()
    if args.write:
        for path in bad:
            (ROOT / path).write_text(files[path])
            print(f"wrote {path}")
        return 0
    for path in bad:
        print(f"{path} is stale: run `python -m humanset.settings_files --write`", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
