"""Keypoint and class vocabularies as data files (training/tasks/vocab/*.json), validated when loaded.

    load("coco17" | "coco_wholebody133" | "sapiens308")  -> KeypointVocab
    load("sapiens28" | "lip20")                          -> ClassVocab
    load("path/to/my_vocab.json")                        -> either, from your own file

A vocabulary that does not hold together (wrong count, duplicate names, a flip pair out of range or not
symmetric, a left_* point paired with anything but its right_* twin) raises VocabError naming the file.
The JSON files are written by `python -m training.tasks.vocab.generate`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

BUILTIN = ("coco17", "coco_wholebody133", "sapiens308", "sapiens28", "lip20")


class VocabError(ValueError):
    pass


@dataclass(frozen=True)
class KeypointVocab:
    name: str
    names: tuple[str, ...]
    flip_pairs: tuple[tuple[int, int], ...]
    skeleton: tuple[tuple[int, int], ...]
    sigmas: np.ndarray  # OKS sigma per keypoint
    groups: dict

    def __len__(self):
        return len(self.names)

    @property
    def flip_index(self) -> np.ndarray:
        return flip_permutation(len(self.names), self.flip_pairs)


@dataclass(frozen=True)
class ClassVocab:
    name: str
    names: tuple[str, ...]
    flip_pairs: tuple[tuple[int, int], ...]
    weights: np.ndarray  # cross-entropy class weights

    def __len__(self):
        return len(self.names)

    @property
    def flip_index(self) -> np.ndarray:
        return flip_permutation(len(self.names), self.flip_pairs)


def flip_permutation(n: int, pairs) -> np.ndarray:
    """index i -> its mirror twin (itself if none): new[:, i] = old[:, perm[i]] after a horizontal flip."""
    perm = np.arange(n)
    for a, b in pairs:
        perm[a], perm[b] = b, a
    return perm


def _side(name: str) -> tuple[str | None, str]:
    low = name.lower().replace("-", "_")
    for side in ("left", "right"):
        if low.startswith(side + "_"):
            return side, low[len(side) + 1:]
    return None, low


def validate(raw: dict, label: str) -> None:
    def fail(msg):
        raise VocabError(f"vocabulary {label}: {msg}")

    for key in ("kind", "name", "count", "names", "flip_pairs"):
        if key not in raw:
            fail(f"missing field {key!r}")
    names, n = raw["names"], raw["count"]
    if len(names) != n:
        fail(f"declares count {n} but lists {len(names)} names")
    if len(set(names)) != n:
        dup = sorted({x for x in names if names.count(x) > 1})
        fail(f"duplicate names {dup[:5]}")
    seen = set()
    for pair in raw["flip_pairs"]:
        if len(pair) != 2:
            fail(f"flip pair {pair} is not a pair")
        a, b = pair
        if not (0 <= a < n and 0 <= b < n) or a == b:
            fail(f"flip pair {pair} out of range 0..{n - 1} or self-paired")
        if a in seen or b in seen:
            fail(f"index in flip pair {pair} appears in another pair: flipping must be an involution")
        seen.update((a, b))
        (sa, ra), (sb, rb) = _side(names[a]), _side(names[b])
        if (sa or sb) and not ({sa, sb} == {"left", "right"} and ra == rb):
            fail(f"flip pair {pair} joins {names[a]!r} and {names[b]!r}: a left_X must pair with right_X")
    # every sided name must have its twin paired
    index = {_side(x): i for i, x in enumerate(names)}
    for i, x in enumerate(names):
        side, rest = _side(x)
        if side and ({"left": "right", "right": "left"}[side], rest) in index and i not in seen:
            fail(f"{x!r} has a mirror twin but no flip pair")
    if raw["kind"] == "keypoints":
        for key in ("skeleton", "sigmas"):
            if key not in raw:
                fail(f"missing field {key!r}")
        for edge in raw["skeleton"]:
            if len(edge) != 2 or not all(0 <= e < n for e in edge):
                fail(f"skeleton edge {edge} out of range 0..{n - 1}")
        if len(raw["sigmas"]) != n or not all(s > 0 for s in raw["sigmas"]):
            fail(f"needs {n} positive OKS sigmas, has {len(raw['sigmas'])}")
        covered = sorted(i for lo, hi in raw.get("groups", {}).values() for i in range(lo, hi))
        if raw.get("groups") and covered != list(range(n)):
            fail("groups must cover every keypoint exactly once")
    elif raw["kind"] == "classes":
        w = raw.get("weights")
        if w is None or len(w) != n or not all(x > 0 for x in w):
            fail(f"needs {n} positive class weights")
    else:
        fail(f"kind {raw['kind']!r} is neither 'keypoints' nor 'classes'")


@lru_cache(maxsize=None)
def load(name_or_path: str) -> KeypointVocab | ClassVocab:
    if name_or_path in BUILTIN:
        text = resources.files(__package__).joinpath(f"{name_or_path}.json").read_text()
        label = f"{name_or_path} (built in)"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise VocabError(f"vocabulary {name_or_path!r}: neither a built-in ({', '.join(BUILTIN)}) "
                             f"nor a JSON file")
        text, label = path.read_text(), str(path)
    raw = json.loads(text)
    validate(raw, label)
    pairs = tuple(tuple(p) for p in raw["flip_pairs"])
    if raw["kind"] == "keypoints":
        return KeypointVocab(raw["name"], tuple(raw["names"]), pairs, tuple(tuple(e) for e in raw["skeleton"]),
                             np.asarray(raw["sigmas"], np.float64), raw.get("groups", {}))
    return ClassVocab(raw["name"], tuple(raw["names"]), pairs, np.asarray(raw["weights"], np.float32))
