"""README runs as written: every command README shows is executed, in README's order, in a scratch folder,
and must exit 0 without a traceback.

Commands run in this process (`humanset.cli.main`, the session's Ray): what a user types, without paying
for an interpreter and a Ray start per line; `render` runs as a program (Blender writes to the process's
file descriptors, which pytest's capture replaces). The only changes to README's text are these, each a table:
- SMALL: the flags README itself gives for a small CPU run (parsed from README, so README and the test
  cannot drift apart), then COUNTS: step and frame counts cut to the fewest that exercise the command;
- INPUTS: what README assumes the reader has (a crawl, a photo, hand labels, a scan library), provided
  here, and the card thresholds README asks the reader to copy (T_FROM_CARD);
- ELSEWHERE: the commands that need a cluster or an object store, run as README shows them by the tests
  named there; SETUP: the two set-up commands, which are how this suite itself is run;
- `browse`, a server, runs as a program on any free port (`--port 0`), serves its page once and is stopped
  with Ctrl-C, as its reader stops it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.e2e

SETUP = {"make demo": "tests/training/filters/test_train_filters.py",  # the demo's steps, each in its own test
         "make test": "tests/test_readme_runs.py"}  # this suite
CLUSTER = ("tests/pipeline/engine/test_cluster.py", "test_ray_up_submit_job_submit_down_on_loopback")
ELSEWHERE = {"ray job submit": CLUSTER, "ray up": CLUSTER, "ray submit": CLUSTER,  # README line -> (file, test)
             "humanset stats s3://": ("tests/pipeline/engine/test_s3_run.py", "test_stats_query_and_report_read_a_run_on_s3")}
SUBCOMMANDS = {"pretrain": {"vis", "export"}, "render": {"scan-index", "export", "config", "demo"}}
COUNTS = {"--steps": "2", "--frames": "1"}  # longer runs prove nothing more about the command


def small_flags() -> dict[str, list[str]]:
    """README's own small settings: `FLAGS` for pretrain / finetune / train-filter, and the render ones."""
    text = " ".join(README.split())
    found = {cmd: shlex.split(flags) for flags, cmd in re.findall(r"`(--[^`]+)` for (pretrain|finetune|train-filter)",
                                                                    text)}
    render = re.search(r"`(--set sampling\.camera\.height[^`]+)` makes it seconds", text)
    if render:
        found["render"] = shlex.split(render.group(1))
    return found


def readme_commands() -> list[tuple[str, str]]:
    """(kind, text) of every command README shows: ("shell", one command line) or ("python", a block)."""
    out = []
    for lang, body in re.findall(r"```(bash|python)\n(.*?)```", README, re.S):
        if lang == "python":
            out.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:  # `ray up ... && ray submit ...`: two commands
                n = words.index("&&") if "&&" in words else len(words)
                out.append(("shell", shlex.join(words[:n])))
                words = words[n + 1:]
    return out


def with_small_flags(argv: list[str], small: dict[str, list[str]]) -> list[str]:
    """argv with README's small flags for its command (a flag README gives replaces the line's own), then
    COUNTS."""
    sub = argv[2] if len(argv) > 2 and argv[2] in SUBCOMMANDS.get(argv[1], ()) else None
    extra = [] if sub else small.get(argv[1], [])
    if extra:
        given = {extra[i]: i for i in range(len(extra)) if extra[i].startswith("--") and extra[i] != "--set"}
        kept, i = [], 0
        while i < len(argv):
            if argv[i] in given:
                i += 2
                continue
            kept.append(argv[i])
            i += 1
        argv = kept + extra
    return [COUNTS.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]


def test_readme_names_its_small_settings_and_every_command_is_run_somewhere():
    small = small_flags()
    assert set(small) == {"pretrain", "finetune", "train-filter", "render"}, small
    shown = [text for kind, text in readme_commands() if kind == "shell"]
    for text in shown:
        if text in SETUP:
            assert (ROOT / SETUP[text]).is_file()
            continue
        where = next((w for k, w in ELSEWHERE.items() if text.startswith(k)), None)
        if where:  # the test named runs README's command as it is written
            assert f"def {where[1]}(" in (ROOT / where[0]).read_text(), (text, where)
            continue
        assert text.startswith("humanset "), f"README shows a command this test does not run: {text}"


@pytest.fixture
def scratch(tmp_path, monkeypatch, ray_local):
    """A reader's folder: a crawl, a photo, a scan library of one mesh. The crawl is the photos the demo ships
    and a clean crop of its astronaut, so that more than one is kept at the default person cut whatever its
    calibration: train-filter needs two (one to train on, one to validate on)."""
    import io

    from PIL import Image

    from pipeline.demo.crawl import encode, shipped_photos, write_webdataset

    photos = shipped_photos()
    astronaut = Image.open(io.BytesIO(photos["astronaut"])).convert("RGB")
    crop = encode(astronaut.crop((0, 0, astronaut.width * 3 // 4, astronaut.height)), quality=95)
    samples = [(f"{i:06d}", "png" if data[:4] == b"\x89PNG" else "jpg", data, name)
               for i, (name, data) in enumerate(photos.items())]
    write_webdataset(tmp_path / "crawl", samples + [("999999", "jpg", crop, "astronaut: clean crop")])
    (tmp_path / "photo.jpg").write_bytes(photos["bus"])
    scans = tmp_path / "data" / "scans"
    scans.mkdir(parents=True)
    # a person-sized box standing along Y, as a scan library's OBJ files are exported
    corners = [(x, y, z) for x in (-0.25, 0.25) for y in (0.0, 1.7) for z in (-0.15, 0.15)]
    faces = [(1, 2, 4, 3), (5, 7, 8, 6), (1, 5, 6, 2), (3, 4, 8, 7), (1, 3, 7, 5), (2, 6, 8, 4)]
    (scans / "box.obj").write_text("".join(f"v {x} {y} {z}\n" for x, y, z in corners)
                                   + "".join("f " + " ".join(map(str, f)) + "\n" for f in faces))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def inputs(argv: list[str], scratch: Path) -> list[str]:
    """README's placeholders filled: /data/scans is the scratch library, T_FROM_CARD each card's threshold,
    labels.csv hand labels written from the run (as a reader labels a few samples)."""
    out = []
    for a in argv:
        if a.startswith("/data/scans"):
            a = str(scratch / a.lstrip("/"))
        m = re.match(r"(\w+)\.max_score=T_FROM_CARD", a)
        if m:
            card = json.loads((scratch / "models" / m.group(1) / "card.json").read_text())
            a = f"{m.group(1)}.max_score={card['threshold']['score']:.4f}"
        out.append(a)
    if "--labels" in out:
        labels = scratch / out[out.index("--labels") + 1]
        import catalog
        rows = catalog.connect(out[2]).sql("SELECT sample_id, keep FROM samples WHERE person_score_max IS NOT NULL "
                                           "ORDER BY sample_id").fetchall()
        labels.write_text("sample_id,label\n" + "".join(f"{s},person={int(k)}\n" for s, k in rows))
    return out


def program(args: list[str], cwd: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "humanset.cli", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=1200)
    return p.returncode, p.stderr


def served(args: list[str], cwd: Path) -> tuple[int, str]:
    """A server README starts: on a free port, its first page fetched, then Ctrl-C (SIGINT), which ends it with 0."""
    import signal
    import urllib.request

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # Ctrl-C as a reader's terminal delivers it, even where this suite runs with SIGINT ignored (a shell's
    # background job): Python leaves an ignored SIGINT ignored, and the server would never stop
    p = subprocess.Popen([sys.executable, "-m", "humanset.cli", *args, "--port", "0"], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = p.stdout.readline()  # "browse RUN: http://127.0.0.1:PORT/ (...)"; empty if it ended
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if url:
            with urllib.request.urlopen(url.group(0), timeout=60) as page:
                assert page.status == 200 and b"<html" in page.read().lower()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return (p.returncode if url else p.returncode or 1), line + err


def test_every_readme_command_runs_as_written(scratch, capsys, request):
    from humanset.cli import main

    small = small_flags()
    ran, timings = [], []
    for kind, text in readme_commands():
        if kind == "python":
            exec(compile(text, "README.md", "exec"), {})
            ran.append("python block")
            continue
        if text in SETUP or any(text.startswith(k) for k in ELSEWHERE):
            continue
        argv = inputs(with_small_flags(shlex.split(text, comments=True), small), scratch)
        t0 = time.perf_counter()
        if argv[1:2] == ["browse"]:
            status, err = served(argv[1:], scratch)
        elif argv[1:2] == ["render"] and not set(argv[2:3]) & SUBCOMMANDS["render"]:
            status, err = program(argv[1:], scratch)  # Blender writes to the process's own descriptors
        else:
            status, err = main(argv[1:]), capsys.readouterr().err
        assert status == 0 and "Traceback" not in err, \
            f"{' '.join(argv)}: exit {status}\n{err[-3000:]}\nthe commands before it:\n" + "\n".join(timings)
        ran.append(argv[1])
        timings.append(f"{time.perf_counter() - t0:6.1f} s  {' '.join(argv)[:110]}")
    if request.config.getoption("capture") == "no":  # pytest -s: where the minutes go
        with capsys.disabled():
            print("\n" + "\n".join(timings))
    assert {"curate", "select", "render", "pretrain", "finetune", "train-filter", "query", "browse",
            "python block"} <= set(ran)
