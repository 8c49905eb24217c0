"""Part-segmentation ground truth: anny's skinning bones -> the Sapiens 28-class vocabulary (pure numpy).

The mapping is data, in render/parts.json: the vocabulary's class names (id = position, 0 = Background,
the same list as training/tasks/vocab/sapiens28.json) and ordered (bone glob, class) rules; the first rule
that matches a bone wins. A vertex takes the class of the bone with the largest skinning weight; a
triangle takes the class most of its three corners have (the first corner's on a three-way tie), so
labels are constant per face and the renderer and the oracle agree on every pixel centre.
Classes a naked body cannot have (clothing, hair, lips, teeth) never occur.
"""
from __future__ import annotations

import fnmatch
import json
from functools import lru_cache
from importlib import resources

import numpy as np


@lru_cache(maxsize=1)
def mapping() -> dict:
    return json.loads((resources.files(__package__) / "parts.json").read_text())


def vocabulary() -> dict:
    """What the run manifest records: the vocabulary's name and its class names (id = index)."""
    m = mapping()
    return {"name": m["vocabulary"], "names": list(m["names"])}


def bone_classes(bone_labels: list[str]) -> np.ndarray:
    """Class id per bone; a bone no rule names is an error (the mapping must cover the whole rig)."""
    m = mapping()
    ids = {n: i for i, n in enumerate(m["names"])}
    out = np.zeros(len(bone_labels), np.uint8)
    for b, bone in enumerate(bone_labels):
        cls = next((c for pattern, c in m["anny_bones"] if fnmatch.fnmatchcase(bone, pattern)), None)
        if cls is None:
            raise KeyError(f"render/parts.json: no rule maps anny bone {bone!r} to a class; add one")
        out[b] = ids[cls]
    return out


def vertex_classes(bone_weights: np.ndarray, bone_indices: np.ndarray, bone_class: np.ndarray) -> np.ndarray:
    """(V,) class of each vertex's heaviest bone, from sparse (V, k) skinning weights and bone indices."""
    top = np.argmax(bone_weights, axis=1)
    return bone_class[bone_indices[np.arange(len(top)), top]]


def face_classes(faces: np.ndarray, vertex_class: np.ndarray) -> np.ndarray:
    """(F,) majority class of each triangle's corners (the first corner's when all three differ)."""
    c = vertex_class[np.asarray(faces)]
    return np.where(c[:, 1] == c[:, 2], c[:, 1], c[:, 0]).astype(np.uint8)
