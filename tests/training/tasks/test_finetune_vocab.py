"""Keypoint and class vocabularies: counts, flip pairs, skeletons, weights; broken files are refused."""
import json

import numpy as np
import pytest

from training.tasks.vocab import BUILTIN, VocabError, load
from training.tasks.vocab import generate


@pytest.mark.parametrize("name,count", [("coco17", 17), ("coco_wholebody133", 133), ("sapiens308", 308),
                                        ("sapiens28", 28), ("lip20", 20)])
def test_builtin_vocabularies_load_with_their_counts(name, count):
    v = load(name)
    assert len(v) == count
    perm = v.flip_index
    assert sorted(perm) == list(range(count))  # a permutation
    assert (perm[perm] == np.arange(count)).all()  # flipping twice is the identity


def test_json_files_match_the_generator():
    for name, build in generate.VOCABS.items():
        on_disk = json.loads((generate.HERE / f"{name}.json").read_text())
        assert on_disk == json.loads(generate.render(build())), f"{name}.json is stale: run python -m training.tasks.vocab.generate"


def test_sapiens308_group_structure():
    v = load("sapiens308")
    sizes = {g: hi - lo for g, (lo, hi) in v.groups.items()}
    assert sizes == {"body": 21, "hands": 42, "extra_body": 7, "face": 238}
    body = v.names[:21]
    assert "left_wrist" not in body and "left_big_toe" in body
    assert {"left_olecranon", "right_cubital_fossa", "left_acromion", "neck"} <= set(v.names)
    face = v.names[70:]
    assert sum("iris" in n for n in face) == 18 and sum("pupil" in n for n in face) == 18
    assert sum(n.split("_", 1)[1].startswith("ear_") for n in face if "_" in n) == 52


def test_known_flip_pairs():
    coco = load("coco17")
    assert coco.names[coco.flip_index[coco.names.index("left_wrist")]] == "right_wrist"
    assert coco.flip_index[0] == 0  # the nose is its own mirror
    wb = load("coco_wholebody133")
    assert wb.flip_index[23 + 36] == 23 + 45  # iBUG outer eye corners
    assert wb.names[wb.flip_index[wb.names.index("left_pinky_finger4")]] == "right_pinky_finger4"
    seg = load("sapiens28")
    assert seg.names[seg.flip_index[seg.names.index("Left_Shoe")]] == "Right_Shoe"
    assert seg.weights[0] == pytest.approx(0.1) and seg.weights[seg.names.index("Tongue")] == 10
    lip = load("lip20")
    assert lip.names[lip.flip_index[lip.names.index("Left-arm")]] == "Right-arm"


def _write(tmp_path, raw):
    path = tmp_path / "v.json"
    path.write_text(json.dumps(raw))
    load.cache_clear()
    return str(path)


@pytest.mark.parametrize("change,message", [
    (lambda r: r.update(count=18), "declares count 18"),
    (lambda r: r["flip_pairs"].append([0, 99]), "out of range"),
    (lambda r: r["flip_pairs"].append([1, 4]), "appears in another pair"),
    (lambda r: r.update(flip_pairs=[[1, 4]] + r["flip_pairs"][1:]), "a left_X must pair with right_X"),
    (lambda r: r.update(flip_pairs=r["flip_pairs"][1:]), "mirror twin but no flip pair"),
    (lambda r: r["skeleton"].append([0, 17]), "skeleton edge"),
    (lambda r: r["names"].__setitem__(1, "nose"), "duplicate names"),
])
def test_broken_vocabularies_are_refused(tmp_path, change, message):
    raw = generate.coco17()
    raw = json.loads(json.dumps(raw))
    change(raw)
    with pytest.raises(VocabError, match=message):
        load(_write(tmp_path, raw))


def test_class_weights_are_checked(tmp_path):
    raw = json.loads(json.dumps(generate.lip20()))
    raw["weights"] = raw["weights"][:-1]
    with pytest.raises(VocabError, match="20 positive class weights"):
        load(_write(tmp_path, raw))
    assert set(BUILTIN) == set(generate.VOCABS)
