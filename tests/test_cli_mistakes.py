"""One line for every mistake: every command of `humanset --help`, given what a newcomer gets wrong (a missing
path, a folder of the wrong kind, a file where a folder belongs, a non-image, an empty string), exits 2 or
3 with one line on stderr that names the input and the fix, writes nothing, and shows no traceback
(`humanset -v` shows it). A closed stdout pipe (`humanset stats RUN | head`) ends the command quietly.

The table runs in this process (`humanset.cli.main`: the behaviour is the same, without an interpreter
start per row); the rows about the console itself (a pipe, `-v`, what reaches the terminal) run
`humanset` as a program.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from catalog import run_kind
from humanset.cli import build_parser, main
from ray_lines import ours

ROOT = Path(__file__).resolve().parents[1]
FIXES = ("pass ", "check ", "rerun", "drop ", "choose ", "use ", "lower ", "wait ", "give ", "free ", "remove ", "resume")

# (argv, what the line must name): {NAME} is a path of the `world` fixture, {NEW} a path that must still
# not exist afterwards (nothing written), "" an empty string
TABLE = [
    (["demo", "--output", "{FILE}"], "{FILE}"),
    (["demo", "--output", "{CURATE}"], "{CURATE}"),
    (["pretrain-demo", "--data", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["curate", "--input", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["curate", "--input", "{PHOTOS}", "--output", "{RENDER}"], "{RENDER}"),
    (["curate", "--input", "{PHOTOS}", "--output", "{FILE}"], "{FILE}"),
    (["curate", "--input", "", "--output", "{NEW}"], "--input"),
    (["select", "{MISSING}", "--set", "person.min_score=0.9", "--output", "{NEW}"], "{MISSING}"),
    (["select", "{RENDER}", "--set", "person.min_score=0.9", "--output", "{NEW}"], "{RENDER}"),
    (["calibrate", "{CURATE}", "--labels", "{MISSING}"], "{MISSING}"),
    (["calibrate", "{CURATE}", "--labels", "{IMAGE}"], "{IMAGE}"),
    (["stats", "{MISSING}"], "{MISSING}"),
    (["stats", "{RENDER}"], "{RENDER}"),
    (["stats", "{FILE}"], "{FILE}"),
    (["query", "{MISSING}", "SELECT 1"], "{MISSING}"),
    (["query", "{CURATE}", ""], "SQL"),
    (["browse", "{MISSING}", "--port", "0"], "{MISSING}"),
    (["browse", "{RENDER}", "--port", "0"], "{RENDER}"),
    (["report", "{MISSING}"], "{MISSING}"),
    (["report", "{RENDER}"], "{RENDER}"),
    (["pretrain", "--data", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["pretrain", "--data", "{PHOTOS}", "--output", "{NEW}"], "{PHOTOS}"),
    (["pretrain", "--data", "{SHARDS}", "--output", "{CURATE}"], "{CURATE}"),
    (["pretrain", "--data", "{SHARDS}", "--output", "{PRETRAIN}"], "--resume"),
    (["pretrain", "vis", "--checkpoint", "{MISSING}", "{IMAGE}", "--out", "{NEW}"], "{MISSING}"),
    (["pretrain", "vis", "--checkpoint", "{ENCODER}", "{IMAGE}", "--out", "{NEW}"], "{ENCODER}"),
    (["pretrain", "vis", "--checkpoint", "{TUNED}", "{IMAGE}", "--out", "{NEW}"], "{TUNED}"),
    (["pretrain", "vis", "--checkpoint", "{PRETRAIN}", "{FILE}", "--out", "{NEW}"], "{FILE}"),
    (["pretrain", "export", "--checkpoint", "{ENCODER}", "--out", "{NEW}"], "{ENCODER}"),
    (["finetune", "--task", "depth", "--data", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["finetune", "--task", "depth", "--data", "{CURATE}", "--output", "{NEW}"], "{CURATE}"),
    (["finetune", "--task", "depth", "--data", "{RENDER}", "--encoder", "{FILE}", "--output", "{NEW}"], "{FILE}"),
    (["finetune", "--task", "depth", "--data", "{RENDER}", "--output", "{CURATE}"], "{CURATE}"),
    (["evaluate", "--checkpoint", "{MISSING}"], "{MISSING}"),
    (["evaluate", "--checkpoint", "{PRETRAIN}"], "{PRETRAIN}"),
    (["evaluate", "--checkpoint", "{TUNED}", "--data", "{CURATE}"], "{CURATE}"),
    (["predict", "--task", "depth", "--checkpoint", "{TUNED}", "{MISSING}", "--out", "{NEW}"], "{MISSING}"),
    (["predict", "--task", "depth", "--checkpoint", "{TUNED}", "{FILE}", "--out", "{NEW}"], "{FILE}"),
    (["train-filter", "watermark", "--images", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["train-filter", "watermark", "--images", "{PHOTOS}", "--output", "{RENDER}"], "{RENDER}"),
    (["train-filter", "art", "--images", "{PHOTOS}", "--renders", "{CURATE}", "--output", "{NEW}"], "{CURATE}"),
    (["render", "--frames", "1", "--output", "{CURATE}"], "{CURATE}"),
    (["render", "--scans", "{MISSING}", "--frames", "1", "--output", "{NEW}"], "{MISSING}"),
    (["render", "--frames", "1", "--output", "{FILE}"], "{FILE}"),
    (["render", "scan-index", "{MISSING}", "--output", "{NEW}"], "{MISSING}"),
    (["render", "scan-index", "{FILE}", "--output", "{NEW}"], "{FILE}"),
    (["render", "config", "--config", "{MISSING}"], "{MISSING}"),
    (["render", "export", "{MISSING}", "--format", "sapiens", "--to", "{NEW}"], "{MISSING}"),
    (["render", "export", "{CURATE}", "--format", "sapiens", "--to", "{NEW}"], "{CURATE}"),
    (["render", "export", "{RENDER}", "--format", "sapiens", "--to", "{CURATE}"], "{CURATE}"),
    (["render", "demo", "--output", "{CURATE}"], "{CURATE}"),
    (["demo", "--output", ""], "--output"),
    (["pretrain", "export", "--checkpoint", "", "--out", "{NEW}"], "--checkpoint"),
    (["render", "demo", "--output", ""], "--output"),
]
# each row with a missing path again with an empty string there instead
EMPTY = [[a if a != "{MISSING}" else "" for a in argv] for argv, _ in TABLE if "{MISSING}" in argv]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Folders of each kind (their markers; checkpoints made by the real code, untrained), files that are not
    what a command wants, and a path that does not exist."""
    from training.mae import MaskedAutoencoder
    from training.pretrain import PretrainConfig
    from training.tasks.finetune import FinetuneConfig, build_model
    from training_fixtures import skimage_samples, write_curated_shards

    root = tmp_path_factory.mktemp("world")
    w = {"MISSING": root / "nope", "FILE": root / "notes.txt", "IMAGE": root / "photo.jpg", "PHOTOS": root / "photos",
         "CURATE": root / "r1", "RENDER": root / "synth", "PRETRAIN": root / "pt", "TUNED": root / "depth",
         "ENCODER": root / "encoder.pth", "SHARDS": root / "shards"}
    w["FILE"].write_text("not an image, not a checkpoint\n")
    Image.new("RGB", (64, 48), "grey").save(w["IMAGE"])
    w["PHOTOS"].mkdir()
    Image.new("RGB", (64, 48), "grey").save(w["PHOTOS"] / "a.jpg")
    for kind in ("CURATE", "RENDER", "PRETRAIN", "TUNED"):
        run_kind.claim(w[kind], {"CURATE": "curate", "RENDER": "render", "PRETRAIN": "pretrain",
                                 "TUNED": "finetune"}[kind])
    write_curated_shards(w["SHARDS"], skimage_samples()[:2])
    pcfg = PretrainConfig(model="micro", image_size=32)
    mae = MaskedAutoencoder.from_preset("micro", 32)
    (w["PRETRAIN"] / "checkpoints").mkdir()
    torch.save({"model": mae.state_dict(), "config": pcfg.to_dict(), "step": 1,
                "timm_kwargs": mae.encoder.timm_kwargs()}, w["PRETRAIN"] / "checkpoints" / "step-00000001.pt")
    torch.save({k[len("encoder."):]: v for k, v in mae.state_dict().items() if k.startswith("encoder.")}, w["ENCODER"])
    fcfg = FinetuneConfig(task="depth", model="micro", image_size=(32, 32), head_width=8, data=str(w["RENDER"]))
    (w["TUNED"] / "checkpoints").mkdir()
    torch.save({"model": build_model(fcfg).state_dict(), "config": fcfg.to_dict(), "task": "depth", "step": 1},
               w["TUNED"] / "checkpoints" / "step-00000001.pt")
    return w


def fill(argv: list[str], world: dict, new: Path) -> list[str]:
    return [str(new) if a == "{NEW}" else str(world[a[1:-1]]) if a.startswith("{") else a for a in argv]


def commands() -> set[str]:
    """Every command `humanset --help` lists, with the subcommands of pretrain and render."""
    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)
    for cmd, subs in (("pretrain", {"vis", "export"}), ("render", {"scan-index", "config", "export", "demo"})):
        names |= {f"{cmd} {s}" for s in subs}
    return names


def command_of(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] in ("pretrain", "render") and argv[1][:1] not in ("-", "") \
        and not argv[1].startswith("{") else argv[0]


def test_the_table_covers_every_command_and_each_with_an_empty_string():
    covered = {command_of(argv) for argv, _ in TABLE}
    assert covered == commands(), sorted(commands() ^ covered)
    empty = {command_of(argv) for argv in EMPTY + [a for a, _ in TABLE if "" in a]}
    assert empty == commands(), sorted(commands() - empty)


@pytest.mark.parametrize("argv, names", TABLE, ids=[" ".join(a) for a, _ in TABLE])
def test_a_mistake_is_one_line_naming_the_input_and_the_fix(world, tmp_path, capsys, argv, names):
    new = tmp_path / "new"
    status = main(fill(argv, world, new))
    out = capsys.readouterr()
    lines = [line for line in ours(out.err) if line.strip()]
    named = str(world[names[1:-1]]) if names.startswith("{") else names
    assert status in (2, 3), (status, out.err)
    assert len(lines) == 1, out.err
    assert lines[0].startswith("humanset ") and "error" in lines[0] and named in lines[0], lines[0]
    assert any(fix in lines[0] for fix in FIXES), f"no fix named: {lines[0]}"
    assert not new.exists(), f"{argv}: wrote {new} before refusing"


@pytest.mark.parametrize("argv", EMPTY, ids=[" ".join(a) for a in EMPTY])
def test_an_empty_string_is_named_as_one(world, tmp_path, capsys, argv):
    status = main(fill(argv, world, tmp_path / "new"))
    lines = ours(capsys.readouterr().err)
    assert status == 2 and len(lines) == 1 and "is an empty string; pass a value" in lines[0], lines


def humanset(*args, stdout=subprocess.PIPE, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "humanset.cli", *args], stdout=stdout, stderr=subprocess.PIPE,
                            text=True, env=env)


@pytest.mark.parametrize("args", [["--help"], ["query", "--help"]])
def test_a_closed_stdout_pipe_ends_the_command_quietly(args):
    """`humanset ... | head`: the reader has gone before the output is written; no traceback, nothing on stderr
    (not even at the interpreter's exit). A command's own output: tests/explore/test_stats.py, and below."""
    p = humanset(*args)
    p.stdout.close()  # the reader is gone before the first byte
    err = p.stderr.read()
    status = p.wait(timeout=300)
    assert err == "", err
    assert status == 0  # argparse's help ignores a failed write itself


def test_a_command_writing_into_a_closed_pipe_stops_with_the_shells_status(monkeypatch, capsys):
    """In this process: stdout a pipe whose reader has gone (Python ignores SIGPIPE: the write fails with EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    closed = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        assert main(["render", "config"]) == 141  # as a shell reports a process SIGPIPE ended
    finally:
        monkeypatch.undo()
        try:
            closed.close()
        except BrokenPipeError:
            pass
    assert capsys.readouterr().err == ""


@pytest.mark.blender
def test_verbose_shows_the_traceback_the_line_stands_for(world, tmp_path):
    args = ("render", "export", str(world["RENDER"]), "--format", "sapiens", "--to", str(world["CURATE"]))
    p = humanset("-v", *args)
    out, err = p.communicate(timeout=300)
    assert p.returncode != 0 and "Traceback" in err and "RunKindError" in err
    p = humanset(*args)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [
        f"humanset render export: error: {world['CURATE']}: holds a curation run (humanset curate), not an export of "
        "a render run (humanset render export); pass another --to"]
