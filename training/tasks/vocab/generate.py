"""Writes the keypoint and class vocabularies of training/tasks/vocab/*.json from their group structure.

    python -m training.tasks.vocab.generate     # rewrites the JSON files; tests check they are up to date

COCO-17, the part classes and their weights are the published lists. COCO-WholeBody's face (68 iBUG
points) and hands (21 each) follow the public WholeBody order. The Sapiens 308-keypoint names are not
available offline, so they are generated here from the group structure the Sapiens paper gives (body 21,
hands 42, extra body 7, face 238 = eyes 82, iris 18, pupil 18, ears 52, lips / mouth 32, brows 18,
nose 16, chin 2); the order inside each group is ours. Flip pairs are never hand-edited: they come from
the names (left_* <-> right_*), or from the iBUG mirror table for the unnamed WholeBody face points.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

COCO17 = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
          "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
          "right_knee", "left_ankle", "right_ankle"]
COCO17_SKELETON = [(15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
                   (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]
# COCO keypoint OKS sigmas (cocoapi)
COCO17_SIGMAS = [.026, .025, .025, .035, .035, .079, .079, .072, .072, .062, .062, .107, .107, .087, .087,
                 .089, .089]
FEET = ["left_big_toe", "left_small_toe", "left_heel", "right_big_toe", "right_small_toe", "right_heel"]
FEET_SIGMAS = [.068, .066, .066, .092, .094, .094]  # COCO-WholeBody
FINGERS = ["thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger"]
# COCO-WholeBody hand sigmas (root, then 4 joints per finger)
HAND_SIGMAS = [.029, .022, .035, .037, .047, .026, .025, .024, .035, .018, .024, .022, .026, .017, .021, .021,
               .032, .02, .019, .022, .031]
FACE_SIGMA = 0.025  # one value for face points (the published per-point face sigmas are not shipped here)
EXTRA_SIGMA = 0.05

# iBUG-68 mirror table: jaw, brows, nose base, eyes, outer and inner lips
IBUG_MIRROR = ([(i, 16 - i) for i in range(8)] + [(17 + i, 26 - i) for i in range(5)] + [(31, 35), (32, 34)]
               + [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]
               + [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58), (60, 64), (61, 63), (65, 67)])


def hand(side: str) -> list[str]:
    return [f"{side}_hand_root"] + [f"{side}_{f}{j}" for f in FINGERS for j in range(1, 5)]


def hand_skeleton(offset: int) -> list[tuple[int, int]]:
    edges = []
    for f in range(5):
        prev = 0
        for j in range(4):
            cur = 1 + 4 * f + j
            edges.append((offset + prev, offset + cur))
            prev = cur
    return edges


def mirror_name(name: str) -> str | None:
    for a, b in (("left_", "right_"), ("right_", "left_")):
        if name.startswith(a):
            return b + name[len(a):]
    return None


def pairs_from_names(names: list[str]) -> list[tuple[int, int]]:
    index = {n: i for i, n in enumerate(names)}
    return sorted((i, index[m]) for i, n in enumerate(names)
                  if n.startswith("left_") and (m := mirror_name(n)) in index)


def coco17() -> dict:
    return {"kind": "keypoints", "name": "coco17", "count": 17, "names": COCO17,
            "flip_pairs": pairs_from_names(COCO17), "skeleton": COCO17_SKELETON, "sigmas": COCO17_SIGMAS,
            "groups": {"body": [0, 17]}}


def wholebody133() -> dict:
    face = [f"face_{i}" for i in range(68)]
    names = COCO17 + FEET + face + hand("left") + hand("right")
    face0, lh0, rh0 = 23, 91, 112
    pairs = pairs_from_names(names) + [(face0 + a, face0 + b) for a, b in IBUG_MIRROR]
    skeleton = COCO17_SKELETON + [(15, 17), (15, 18), (15, 19), (16, 20), (16, 21), (16, 22),
                                  (9, lh0), (10, rh0)] + hand_skeleton(lh0) + hand_skeleton(rh0)
    sigmas = COCO17_SIGMAS + FEET_SIGMAS + [FACE_SIGMA] * 68 + HAND_SIGMAS * 2
    return {"kind": "keypoints", "name": "coco_wholebody133", "count": 133, "names": names,
            "flip_pairs": sorted(pairs), "skeleton": skeleton, "sigmas": sigmas,
            "groups": {"body": [0, 17], "feet": [17, 23], "face": [23, 91], "left_hand": [91, 112],
                       "right_hand": [112, 133]}}


def sided(parts: list[str]) -> list[str]:
    return [f"{s}_{p}" for s in ("left", "right") for p in parts]


def sapiens308() -> dict:
    body = [n for n in COCO17 if not n.endswith("wrist")] + FEET  # 15 + 6 = 21
    hands = hand("left") + hand("right")  # 42, wrist = hand root
    extra = sided(["olecranon", "cubital_fossa", "acromion"]) + ["neck"]  # 7
    eye = ([f"upper_eyelid_{i}" for i in range(12)] + [f"lower_eyelid_{i}" for i in range(12)]
           + [f"upper_eyelash_{i}" for i in range(8)] + [f"eyelid_crease_{i}" for i in range(8)]
           + ["eye_inner_corner"])  # 41 per eye -> 82
    iris = [f"iris_{i}" for i in range(8)] + ["iris_center"]  # 9 per eye -> 18
    pupil = [f"pupil_{i}" for i in range(8)] + ["pupil_center"]  # 9 per eye -> 18
    ear = [f"ear_{i}" for i in range(26)]  # 26 per ear -> 52
    brow = [f"eyebrow_{i}" for i in range(9)]  # 9 per brow -> 18
    lips = (["upper_lip_outer_center", "lower_lip_outer_center", "upper_lip_inner_center",
             "lower_lip_inner_center"]
            + sided([f"upper_lip_outer_{i}" for i in range(3)] + [f"lower_lip_outer_{i}" for i in range(3)]
                    + [f"upper_lip_inner_{i}" for i in range(3)] + [f"lower_lip_inner_{i}" for i in range(3)]
                    + ["mouth_outer_corner", "mouth_inner_corner"]))  # 4 + 2 x 14 = 32
    nose = ([f"nose_bridge_{i}" for i in range(4)] + ["nose_tip", "columella"]
            + sided(["nose_ala_0", "nose_ala_1", "nose_ala_2", "nostril_0", "nostril_1"]))  # 6 + 10 = 16
    chin = ["chin_center", "chin_bottom"]
    face = sided(eye) + sided(iris) + sided(pupil) + sided(ear) + lips + sided(brow) + nose + chin
    names = body + hands + extra + face
    index = {n: i for i, n in enumerate(names)}
    # body: COCO skeleton without the wrists, feet to ankles, hands hang off the elbows
    skeleton = []
    for a, b in COCO17_SKELETON + [(15, 17), (15, 18), (15, 19), (16, 20), (16, 21), (16, 22)]:
        na = (COCO17 + FEET)[a]
        nb = (COCO17 + FEET)[b]
        if na in index and nb in index:
            skeleton.append((index[na], index[nb]))
    for side in ("left", "right"):
        root = index[f"{side}_hand_root"]
        skeleton.append((index[f"{side}_elbow"], root))
        skeleton += hand_skeleton(root)
        skeleton += [(index[f"{side}_acromion"], index[f"{side}_shoulder"]),
                     (index[f"{side}_olecranon"], index[f"{side}_elbow"])]
    skeleton.append((index["neck"], index["nose"]))
    groups, start = {}, 0
    for g, n in (("body", body), ("hands", hands), ("extra_body", extra), ("face", face)):
        groups[g] = [start, start + len(n)]
        start += len(n)
    sigmas = COCO17_SIGMAS[:9] + COCO17_SIGMAS[11:] + FEET_SIGMAS + HAND_SIGMAS * 2 + [EXTRA_SIGMA] * 7 \
        + [FACE_SIGMA] * 238
    return {"kind": "keypoints", "name": "sapiens308", "count": 308, "names": names,
            "flip_pairs": pairs_from_names(names), "skeleton": skeleton, "sigmas": sigmas, "groups": groups}


SAPIENS28 = ["Background", "Apparel", "Face_Neck", "Hair", "Left_Foot", "Left_Hand", "Left_Lower_Arm",
             "Left_Lower_Leg", "Left_Shoe", "Left_Sock", "Left_Upper_Arm", "Left_Upper_Leg", "Lower_Clothing",
             "Right_Foot", "Right_Hand", "Right_Lower_Arm", "Right_Lower_Leg", "Right_Shoe", "Right_Sock",
             "Right_Upper_Arm", "Right_Upper_Leg", "Torso", "Upper_Clothing", "Lower_Lip", "Upper_Lip",
             "Lower_Teeth", "Upper_Teeth", "Tongue"]
SAPIENS28_WEIGHTS = [0.1, 10, 3, 2, 4, 4, 2, 2, 6, 10, 3, 3, 1, 4, 4, 2, 2, 6, 10, 3, 3, 1, 1, 10, 10, 10, 10, 10]
LIP20 = ["Background", "Hat", "Hair", "Glove", "Sunglasses", "Upper-clothes", "Dress", "Coat", "Socks", "Pants",
         "Jumpsuits", "Scarf", "Skirt", "Face", "Left-arm", "Right-arm", "Left-leg", "Right-leg", "Left-shoe",
         "Right-shoe"]


def class_pairs(names: list[str]) -> list[tuple[int, int]]:
    lower = [n.lower().replace("-", "_") for n in names]
    return pairs_from_names(lower)


def sapiens28() -> dict:
    return {"kind": "classes", "name": "sapiens28", "count": 28, "names": SAPIENS28,
            "flip_pairs": class_pairs(SAPIENS28), "weights": SAPIENS28_WEIGHTS}


def lip20() -> dict:
    # LIP publishes no class weights; uniform weights
    return {"kind": "classes", "name": "lip20", "count": 20, "names": LIP20, "flip_pairs": class_pairs(LIP20),
            "weights": [1.0] * 20}


VOCABS = {"coco17": coco17, "coco_wholebody133": wholebody133, "sapiens308": sapiens308,
          "sapiens28": sapiens28, "lip20": lip20}


def render(vocab: dict) -> str:
    return json.dumps(vocab, indent=1) + "\n"


def main() -> None:
    for name, build in VOCABS.items():
        (HERE / f"{name}.json").write_text(render(build()))
        print(f"wrote {name}.json")


if __name__ == "__main__":
    main()
