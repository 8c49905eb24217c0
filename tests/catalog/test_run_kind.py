"""Every output folder has one owner and one kind (catalog/run_kind.py), and a finished run leaves no lock."""
import json
import os
import socket
import subprocess
import sys

import pytest

import catalog
from catalog import run_kind
from catalog.io import RunLocked, run_lock
from catalog.storage import open_storage


def test_a_folder_is_claimed_once_and_refused_to_another_kind(tmp_path):
    out = tmp_path / "r1"
    assert run_kind.check(out, "render") is None and not out.exists()  # a check writes nothing
    run_kind.claim(out, "render", {"seed": 0})
    assert run_kind.kind_of(out) == "render"
    assert run_kind.claim(out, "render", {"seed": 0})["identity"] == {"seed": 0}  # the same run: resumed
    with pytest.raises(run_kind.RunKindError) as e:
        run_kind.check(out, "curate")
    assert str(e.value) == (f"{out}: holds a render run (humanset render), not a curation run (humanset curate); "
                            "pass another --output")
    with pytest.raises(run_kind.RunKindError, match=r"other settings \(seed 0, now 1\); rerun the same command to "
                                                    r"resume it with its settings, or pass another --to"):
        run_kind.check(out, "render", {"seed": 1}, flag="--to")


def test_a_file_where_a_folder_belongs_is_named(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(run_kind.RunKindError, match="notes.txt: is a file, not a folder; pass a folder as --output"):
        run_kind.check(f, "pretrain")


@pytest.mark.parametrize("files, kind", [
    ({"render.json": {"seed": 0}}, "render"),
    ({"manifest.json": {"inputs": ["crawl"], "config": {}}}, "curate"),
    ({"manifest.json": {"selected_from": "/r1", "inputs": [], "config": {}}}, "select"),
    ({"manifest.json": {"format": "sapiens", "complete": True}}, "export"),
    ({"config.json": {"mask_ratio": 0.75}}, "pretrain"),
    ({"config.json": {"task": "depth"}}, "finetune"),
    ({"card.json": {"filter": "art"}}, "filter"),
    ({"notes.json": {}}, None),
])
def test_folders_made_before_the_marker_are_known_by_their_files(tmp_path, files, kind):
    for name, body in files.items():
        (tmp_path / name).write_text(json.dumps(body))
    assert run_kind.kind_of(tmp_path) == kind
    if kind:  # claimed by its own kind it gets its marker; by another it is refused
        run_kind.claim(tmp_path, kind)
        assert json.loads((tmp_path / run_kind.MARKER).read_text())["kind"] == kind
        with pytest.raises(run_kind.RunKindError):
            run_kind.claim(tmp_path, "demo")


def test_the_marker_lives_on_object_stores_too():
    store = open_storage("memory://kinds/run")
    run_kind.claim(store, "select", {"selected_from": "memory://kinds/r1"})
    assert store.read_json(run_kind.MARKER)["kind"] == "select"
    assert run_kind.kind_of("memory://kinds/run") == "select"
    with pytest.raises(run_kind.RunKindError, match="holds a re-cut of a curation run"):
        run_kind.check("memory://kinds/run", "curate")


def test_an_input_of_the_wrong_kind_is_named_with_its_flag(tmp_path):
    run_kind.claim(tmp_path, "curate")
    with pytest.raises(run_kind.RunKindError, match=r"--data .*: is a curation run \(humanset curate\); read a render"):
        run_kind.require(tmp_path, ("render",), "--data", "read a render run")
    assert run_kind.require(tmp_path / "absent", ("render",), "--data", "x") is None


def test_a_finished_run_leaves_no_lock_and_a_refusal_names_the_holder(tmp_path):
    with run_lock(tmp_path):
        held = json.loads((tmp_path / ".lock").read_text())
        assert held == {"pid": os.getpid(), "host": socket.gethostname()}
        with pytest.raises(RunLocked) as e:
            with run_lock(tmp_path):
                pass
        assert f"held by pid {os.getpid()} on host {socket.gethostname()}" in str(e.value)
    assert not (tmp_path / ".lock").exists()


def test_a_lock_left_by_a_killed_process_is_taken_over_and_reported(tmp_path, caplog):
    code = ("import os, sys, time; from catalog.io import run_lock\n"
            "with run_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"held by pid {child.pid}"):
            with run_lock(tmp_path):
                pass
    finally:
        child.kill()  # kill -9: nothing removes its .lock
        child.wait()
    assert (tmp_path / ".lock").exists()
    with caplog.at_level("WARNING", logger="catalog.io"):
        with run_lock(tmp_path):
            pass
    assert f"taking over the lock left by pid {child.pid} on host {socket.gethostname()}" in caplog.text
    assert not (tmp_path / ".lock").exists()


def test_a_lock_file_removed_between_open_and_flock_is_not_trusted(tmp_path, monkeypatch):
    """The last holder removes .lock while it still holds it: a process that opened the old file must not
    think it holds the lock a third process now holds on the new one."""
    import fcntl

    real_flock, calls = fcntl.flock, []

    def flock(fd, op):
        if not calls:  # between our open and our flock, the holder finishes and removes the file
            calls.append(fd)
            os.unlink(tmp_path / ".lock")
            (tmp_path / ".lock").write_text("")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with catalog.run_lock(tmp_path):
        assert len(calls) == 1
        fd = os.open(tmp_path / ".lock", os.O_RDWR)
        try:  # the file that is .lock now is the one held
            with pytest.raises(BlockingIOError):
                real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert not (tmp_path / ".lock").exists()
