"""`humanset --help` lists every command once, under the heading of its room, without importing
Ray, torch or Blender."""
import subprocess
import sys

from humanset.cli import ROOMS, build_parser


def test_help_lists_every_command_under_its_room():
    parser = build_parser()
    text = parser.format_help().split("commands, by room:", 1)[1]
    names = set(parser._subparsers._group_actions[0]._name_parser_map)
    assert {"curate", "stats", "pretrain", "finetune", "render", "demo"} <= names
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ")]
    assert sorted(listed) == sorted(names), listed
    headings = [line.strip() for line in text.splitlines() if line.startswith("  ") and not line.startswith("    ")
                and line.strip() in ROOMS]
    assert headings == list(ROOMS)
    # curate sits under curation, render under synthetic humans
    lines = text.splitlines()
    def room_of(cmd):
        room = None
        for line in lines:
            if line.strip() in ROOMS:
                room = line.strip()
            elif line.startswith("    ") and line.split()[0] == cmd:
                return room
    assert room_of("curate").startswith("curation")
    assert room_of("render").startswith("synthetic humans")
    assert room_of("finetune").startswith("training")


def test_help_is_fast_and_imports_no_heavy_library():
    code = ("import sys; from humanset.cli import build_parser; build_parser().format_help(); "
            "print(','.join(m for m in ('ray', 'torch', 'bpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
