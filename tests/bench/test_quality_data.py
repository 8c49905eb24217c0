"""bench/quality: the manifest, the labels and the fixed split agree with each other and the documented rules."""
import hashlib
import importlib.util
import io
import re
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("quality_data", ROOT / "bench" / "quality_data.py")
qd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qd)

MANIFEST = qd.read_manifest()
LABELS = qd.read_labels()


def test_every_image_labelled_once_with_a_known_category():
    ids = [r["id"] for r in MANIFEST]
    assert len(ids) == len(set(ids)), "duplicate ids in images.csv"
    assert set(ids) == set(LABELS), "images.csv and labels.csv list different ids"
    with open(qd.LABELS_CSV) as fh:
        label_ids = [line.split(",", 1)[0] for line in fh.read().splitlines()[1:]]
    assert len(label_ids) == len(set(label_ids)), "an id is labelled twice"
    assert {r["category"] for r in LABELS.values()} <= set(qd.CATEGORIES)
    assert len(MANIFEST) >= 400


def test_rows_are_well_formed_and_not_duplicated():
    shas = Counter(r["sha256"] for r in MANIFEST)
    assert max(shas.values()) == 1, "the same file twice"
    members = Counter((r["package"], r["version"], r["member"]) for r in MANIFEST)
    assert max(members.values()) == 1
    for r in MANIFEST:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", r["id"]), r["id"]  # used as a file name
        assert re.fullmatch(r"[0-9a-f]{64}", r["sha256"]), r["id"]
        assert r["kind"] in qd.KINDS and r["version"] and r["licence"], r["id"]
        assert int(r["width"]) >= 300 and int(r["height"]) >= 300, r["id"]
        assert not r["member"].startswith("/") and ".." not in r["member"].split("/"), r["id"]


def test_no_reserved_package_anywhere():
    for r in MANIFEST:
        text = " ".join(r.values()).lower()
        assert not any(word in text for word in qd.RESERVED), r["id"]


def test_split_is_the_documented_rule_and_each_split_holds_every_category():
    stored = {r["id"]: r["split"] for r in MANIFEST}
    assert all(LABELS[i]["split"] == s for i, s in stored.items()), "labels.csv and images.csv disagree on a split"
    # the rule ran on the labels of the day it was fixed: a later correction notes the category it had
    frozen = [{**r, "category": qd.frozen_category(LABELS[r["id"]])} for r in MANIFEST]
    assert qd.split_rule(frozen) == stored
    counts = Counter((LABELS[i]["category"], s) for i, s in stored.items())
    held = Counter((r["category"], r["split"]) for r in frozen)  # what the rule balanced
    for cat in qd.CATEGORIES:
        assert counts[(cat, "tune")] >= 5 and counts[(cat, "eval")] >= 5, cat
        assert abs(held[(cat, "tune")] - held[(cat, "eval")]) <= 1, cat


def test_batches_are_appended_in_order():
    batches = [int(r["batch"]) for r in MANIFEST]
    assert batches[0] == 1 and batches == sorted(batches), "a later batch is appended after the earlier rows"
    with open(qd.LABELS_CSV) as fh:
        label_ids = [line.split(",", 1)[0] for line in fh.read().splitlines()[1:]]
    assert label_ids == [r["id"] for r in MANIFEST], "labels.csv lists the images in the manifest's order"


def test_frozen_category_reads_a_correction_note():
    assert qd.frozen_category({"category": "painted_person", "note": "relabelled from non_photo: a figure"}) == "non_photo"
    assert qd.frozen_category({"category": "no_person", "note": "a lake"}) == "no_person"
    with pytest.raises(ValueError, match="relabelled from"):
        qd.frozen_category({"category": "no_person", "note": "relabelled from cat: x"})


def test_split_rule_alternates_within_a_category():
    rows = [{"id": f"a{i}", "category": "no_person", "sha256": f"{i:064x}"} for i in range(5)]
    rows += [{"id": "b0", "category": "non_photo", "sha256": "f" * 64}]
    got = qd.split_rule(rows)
    assert [got[f"a{i}"] for i in range(5)] == ["tune", "eval", "tune", "eval", "tune"]
    assert got["b0"] == "tune"


def test_split_rule_appends_a_batch_without_moving_earlier_images():
    first = [{"id": f"a{i}", "category": "no_person", "sha256": f"{i:064x}", "batch": "1"} for i in range(3)]
    later = [{"id": f"n{i}", "category": "no_person", "sha256": f"{i:064x}", "batch": "2"} for i in range(3)]
    later += [{"id": "p0", "category": "person_clear", "sha256": "0" * 64, "batch": "2"}]
    before = qd.split_rule(first)
    got = qd.split_rule(first + later)
    assert {k: got[k] for k in before} == before  # tune, eval, tune: batch 1 as it was
    # batch 2 starts with the split batch 1 left short (eval), so the category stays balanced
    assert [got[f"n{i}"] for i in range(3)] == ["eval", "tune", "eval"]
    assert got["p0"] == "tune"  # a category new in batch 2 starts with tune
    # the sha order decides within a batch, not the order of the rows
    assert qd.split_rule(first + later[::-1]) == got


def _rcc(files: dict[str, bytes], compress: set[str]) -> bytes:
    """A version-2 Qt resource bundle with the files in one folder 'd' under the root."""
    names, data = io.BytesIO(), io.BytesIO()

    def name_off(n):
        off = names.tell()
        names.write(struct.pack(">HI", len(n), 0) + n.encode("utf-16-be"))
        return off

    entries = []
    for n, b in files.items():
        payload = struct.pack(">I", len(b)) + zlib.compress(b) if n in compress else b
        entries.append((name_off(n), 1 if n in compress else 0, data.tell()))
        data.write(struct.pack(">I", len(payload)) + payload)
    d = name_off("d")
    node = lambda noff, flags, a, b: struct.pack(">IHII", noff, flags, a, b) + b"\0" * 8  # noqa: E731
    tree = node(0, 2, 1, 1) + node(d, 2, len(entries), 2)
    tree += b"".join(struct.pack(">IHHHI", off, fl, 0, 0, doff) + b"\0" * 8 for off, fl, doff in entries)
    header = 24
    return (b"qres" + struct.pack(">IIII", 2, header, header + len(tree), header + len(tree) + len(data.getvalue()))
            + b"\0" * 4 + tree + data.getvalue() + names.getvalue())


def test_rcc_reader_reads_plain_and_compressed_entries():
    blob = _rcc({"a.png": b"\x89PNG plain", "b.webp": b"RIFF" + b"x" * 100}, compress={"b.webp"})
    assert dict(qd.rcc_files(blob)) == {"d/a.png": b"\x89PNG plain", "d/b.webp": b"RIFF" + b"x" * 100}
    with pytest.raises(ValueError, match="qres"):
        list(qd.rcc_files(b"nope" + blob[4:]))


def test_fetch_with_a_warm_cache_downloads_nothing(tmp_path, monkeypatch):
    rows = MANIFEST[:2]
    images = tmp_path / "images"
    images.mkdir()
    rows = [{**r, "sha256": hashlib.sha256(r["id"].encode()).hexdigest()} for r in rows]
    for r in rows:  # a warm cache: the right bytes are there (stand-in bytes, their sha)
        (images / qd.image_name(r)).write_bytes(r["id"].encode())
    monkeypatch.setattr(qd, "download", lambda *a: pytest.fail("downloaded with a warm cache"))
    paths = qd.fetch(tmp_path, rows, log=lambda *a: None)
    assert sorted(p.name for p in paths.values()) == sorted(qd.image_name(r) for r in rows)
    # one wrong byte: the package is fetched again
    (images / qd.image_name(rows[0])).write_bytes(b"changed")
    with pytest.raises(pytest.fail.Exception):
        qd.fetch(tmp_path, rows, log=lambda *a: None)


def test_run_names_the_module_a_setup_script_misses(tmp_path):
    script = "import sys; sys.stderr.write(\"ModuleNotFoundError: No module named 'skbuild'\\n\"); sys.exit(1)"
    with pytest.raises(qd.BuildModuleMissing) as err:
        qd._run([qd.sys.executable, "-c", script], cwd=tmp_path)
    assert err.value.module == "skbuild"
    with pytest.raises(RuntimeError, match="failed \\(3\\)") as other:
        qd._run([qd.sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path)
    assert not isinstance(other.value, qd.BuildModuleMissing)


def _fake_pip(monkeypatch, outcomes):
    """_run replaced by a script of outcomes, in call order: None succeeds, an exception is raised."""
    calls = []

    def run(cmd, cwd, env=None):
        calls.append((cmd, env))
        if "--target" in cmd:  # pip install --target DIR makes DIR, as the real one does
            Path(cmd[cmd.index("--target") + 1]).mkdir(parents=True)
        outcome = outcomes[len(calls) - 1]
        if outcome is not None:
            raise outcome
    monkeypatch.setattr(qd, "_run", run)
    return calls


def test_sdist_fallbacks_in_order(tmp_path, monkeypatch):
    pip = ["pip", "download"]
    # a backend not installed here (hatchling): the isolated build fetches it
    calls = _fake_pip(monkeypatch, [qd.BuildModuleMissing("hatchling", ["x"], ""), None])
    qd._sdist(pip, "sahi==0.12.8", tmp_path)
    assert "--no-build-isolation" in calls[0][0] and "--no-build-isolation" not in calls[1][0]
    # a setup.py that imports skbuild, whose isolated build fails too: scikit-build in a throwaway folder
    calls = _fake_pip(monkeypatch, [qd.BuildModuleMissing("skbuild", ["x"], ""), RuntimeError("isolated"), None, None])
    qd._sdist(pip, "opencv-contrib-python==3.4.18.65", tmp_path)
    assert calls[2][0][-1] == "scikit-build" and "--target" in calls[2][0]
    assert calls[3][1]["PYTHONPATH"] == calls[2][0][calls[2][0].index("--target") + 1]
    target = Path(calls[2][0][calls[2][0].index("--target") + 1])
    assert target.parent == tmp_path.parent and not target.exists()  # the throwaway folder is gone
    # anything else: the first attempt's error, not the fallback's
    first = RuntimeError("no build isolation failed")
    _fake_pip(monkeypatch, [first, RuntimeError("isolated failed")])
    with pytest.raises(RuntimeError, match="no build isolation failed"):
        qd._sdist(pip, "x==1", tmp_path)


def test_split_categories_are_the_manifests_split_with_the_labels_categories():
    for split in ("tune", "eval"):
        cats = qd.split_categories(split)
        assert set(cats) == {r["id"] for r in MANIFEST if r["split"] == split} and cats
        assert all(cats[i] == LABELS[i]["category"] for i in cats)
