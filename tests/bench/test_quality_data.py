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


def _bench_csvs(tmp_path):
    """A bench of three batch-1 no_person images, as the two CSVs."""
    images, labels = tmp_path / "images.csv", tmp_path / "labels.csv"
    head = "id,split,package,version,kind,member,sha256,width,height,licence,batch\n"
    rows = [f"a{i},{s},pkg,1,debian,usr/a{i}.jpg,{i:064x},640,480,MIT,1\n" for i, s in enumerate(("tune", "eval", "tune"))]
    images.write_text(head + "".join(rows))
    labels.write_text("id,category,split,note\n" + "".join(f"a{i},no_person,{s},\n"
                                                            for i, s in enumerate(("tune", "eval", "tune"))))
    return images, labels


def _find(i: int, category: str = "no_person", **over) -> dict:
    f = {"id": f"n{i}", "package": "other", "version": "2", "kind": "npm", "member": f"package/n{i}.jpg",
         "sha256": f"{i + 100:064x}", "width": "800", "height": "600", "licence": "MIT", "category": category,
         "note": "a note, with a comma"}
    return f | over


def test_append_batch_adds_the_next_batch_split_by_the_rule(tmp_path):
    images, labels = _bench_csvs(tmp_path)
    new = qd.append_batch([_find(0), _find(1), _find(2, "person_clear")], images, labels)
    assert [n["batch"] for n in new] == ["2", "2", "2"]
    rows, labs = qd.read_csv(images), qd.read_csv(labels)
    assert [r["id"] for r in rows] == ["a0", "a1", "a2", "n0", "n1", "n2"]
    assert [r["id"] for r in labs] == [r["id"] for r in rows]
    assert labs[3]["note"] == "a note, with a comma" and labs[5]["category"] == "person_clear"
    # no_person after batch 1's tune, eval, tune: eval first; a new category starts with tune
    assert [r["split"] for r in rows[3:]] == ["eval", "tune", "tune"]
    stored = qd.split_rule([dict(r, category=lb["category"]) for r, lb in zip(rows, labs)])
    assert all(stored[r["id"]] == r["split"] == lb["split"] for r, lb in zip(rows, labs))
    assert qd.append_batch([_find(3)], images, labels)[0]["batch"] == "3"


@pytest.mark.parametrize("bad, says", [
    ({"id": "a0"}, "new to the bench"),
    ({"id": "Bad_id"}, "[a-z0-9-]"),
    ({"sha256": f"{1:064x}"}, "not yet in the bench"),
    ({"category": "person"}, "category must be one of"),
    ({"kind": "conda"}, "kind one of"),
    ({"package": "wesnoth-data"}, "reserved"),
])
def test_append_batch_refuses_a_bad_find_and_writes_nothing(tmp_path, bad, says):
    images, labels = _bench_csvs(tmp_path)
    before = images.read_text(), labels.read_text()
    with pytest.raises(ValueError, match=re.escape(says)):
        qd.append_batch([_find(0), _find(1, **bad)], images, labels)
    assert (images.read_text(), labels.read_text()) == before


def test_append_batch_refuses_a_missing_column_or_a_file_twice_in_the_batch(tmp_path):
    images, labels = _bench_csvs(tmp_path)
    before = images.read_text(), labels.read_text()
    missing = {k: v for k, v in _find(2).items() if k != "licence"}
    with pytest.raises(ValueError, match="missing licence"):
        qd.append_batch([missing], images, labels)
    with pytest.raises(ValueError, match="not yet in the bench"):
        qd.append_batch([_find(4), _find(5, sha256=f"{104:064x}")], images, labels)  # twice in one batch
    assert (images.read_text(), labels.read_text()) == before


def test_append_from_the_command_line(tmp_path, monkeypatch, capsys):
    images, labels = _bench_csvs(tmp_path)
    monkeypatch.setattr(qd, "IMAGES_CSV", images)
    monkeypatch.setattr(qd, "LABELS_CSV", labels)
    finds = tmp_path / "finds.csv"
    with open(finds, "w", newline="") as fh:
        w = qd.csv.DictWriter(fh, qd.FIND_COLUMNS)
        w.writeheader()
        w.writerows([_find(0), _find(1)])
    assert qd.main(["--append", str(finds)]) == 0
    assert '"appended": 2' in capsys.readouterr().out
    assert len(qd.read_csv(images)) == len(qd.read_csv(labels)) == 5


def test_append_batch_refuses_a_bench_whose_stored_split_the_rule_would_move(tmp_path):
    images, labels = _bench_csvs(tmp_path)
    images.write_text(images.read_text().replace("a2,tune", "a2,eval"))
    with pytest.raises(ValueError, match=r"would move \['a2'\]"):
        qd.append_batch([_find(0)], images, labels)
