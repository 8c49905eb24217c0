"""Does a body-part detector find the people the calibrated cut and the MoveNet look still lose (faces painted or
hidden by smoke, people hugging, turning a backflip, lying by a laptop)? NudeNet 3.4.2's detector as a third look,
on the quality bench's tune split.

The model: PyPI `nudenet` 3.4.2's `320n.onnx` (a YOLOv8n trained on 18 body-part classes, clothed and unclothed: faces,
feet, belly, armpits, buttocks, breasts, ...; 320 px input). The stop-62 registry search listed it ("nudenet detects
body parts") and never measured it. Its wheel's metadata says MIT, its LICENSE file is the AGPL-3.0 text: taking it
into the product would need that settled first. Needs `pip install --no-deps nudenet==3.4.2` (it is read from that
package; nothing is downloaded at run time, nothing unpickled).

    python bench/quality.py --split tune --output runs/tune-now --write-labels labels.csv
    python research/person/nudenet_look.py runs/tune-now labels.csv [--rows FILE.csv]

Result (2026-12-07 19:14 UTC, load 1.1, 0.042 CPU s per image on one thread; 55 images under the cut): fails. "face"
1 win (the laptop in blue light, FACE_MALE 0.58), 0 losses, p 1.0, and a painted person newly passing; "parts2" none.
Not one of the other eight people under the cut has a part over 0.5 in its box; at 0.3-0.4 (not a verdict) faces come
up on a dog, a cat and the Mona-Lisa-like renders as often as on people, and fruit is read as buttocks. On passing
portraits it finds the face at ~0.8 (grace_hopper, obama, volt-profile-glasses), so the model runs as it should.
docs/benchmarks.md, "a body-part detector as a third look".

Rule, written 2026-12-07 19:13 UTC, before the model was run on any bench image:
- the run: `runs/tune-now`, tune curated with the product of b6dfcdc (defaults, score-all, the MoveNet look on);
- rows: movenet_look.run_rows's rows without MoveNet: research.bench_tune.person_look_rows (each labelled tune image's
  top box over the size rule, person_clear = 1, the rest 0; painted_person's rows apart) and an "extra" row (label 0)
  for every other sample with a box over the size rule;
- the detector: the whole image decoded as the stage decodes it (EXIF-oriented, pipeline.inputs.images.load_rgb, longer
  side at most 1024), padded right and bottom to a square, resized to 320 x 320 (bilinear), RGB in 0..1; the package's
  own post-processing (score >= 0.2, NMS 0.45); each detection mapped to original pixels;
- a part is in a row's box when the centre of the part's box lies inside the person box (original pixels);
- two verdicts, each alone, applied to the images the run's person stage rejects with the calibrated cut as its only
  person reason (after the shipped look): "face", a FACE_FEMALE or FACE_MALE of score >= 0.5 in the box; "parts2",
  parts of at least two distinct classes, each >= 0.5, in the box;
- wins are person_clear images newly passing the person stage; losses any label-0 image newly passing (person_small,
  no_person, text_or_mark, non_photo); painted people newly passing are reported beside them (the art stage's);
- a verdict goes on only with at least 5 wins and no loss (sign test p <= 0.1); then the tune cascade's check
  (research.bench_tune.with_person_verdict against the run: no loss, tune's kept-set targets still met), then one eval
  gate (an eval run of the same product, scored once: more cascade wins than losses, no target the default meets
  missed); a sweep of the 0.5 is printed beside and is not a verdict.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CUT_ONLY, PART, DECODE, SIDE = "person:calibrated_score<=0.9", 0.5, 1024, 320
FACES = {"FACE_FEMALE", "FACE_MALE"}


class Parts:
    """NudeNet's detector on one image: [(class, score, (x1, y1, x2, y2) in original pixels)]."""

    def __init__(self):
        import nudenet.nudenet as nn
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.nn = nn
        self.session = ort.InferenceSession(str(Path(nn.__file__).parent / "320n.onnx"), so,
                                            providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def __call__(self, rgb: np.ndarray, scale: float) -> list[tuple]:
        from PIL import Image

        h, w = rgb.shape[:2]
        n = max(h, w)
        sq = np.zeros((n, n, 3), np.uint8)
        sq[:h, :w] = rgb
        x = np.asarray(Image.fromarray(sq).resize((SIDE, SIDE), Image.BILINEAR), np.float32) / 255.0
        out = self.session.run(None, {self.name: x.transpose(2, 0, 1)[None]})
        dets = self.nn._postprocess(out, n - w, n - h, n / w, n / h, w, h, SIDE, SIDE)
        return [(d["class"], d["score"], tuple(v / scale for v in (d["box"][0], d["box"][1],
                                                                   d["box"][0] + d["box"][2], d["box"][1] + d["box"][3])))
                for d in dets]


def inside(part_box, box) -> bool:
    cx, cy = (part_box[0] + part_box[2]) / 2, (part_box[1] + part_box[3]) / 2
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]


def verdicts(parts: list[tuple], box, t: float = PART) -> dict[str, bool]:
    got = {c for c, s, b in parts if s >= t and inside(b, box)}
    return {"face": bool(got & FACES), "parts2": len(got) >= 2}


def main() -> int:
    import time

    from bench import quality_data
    from pipeline.inputs.images import load_rgb
    from research.bench_tune import bench_quality, look_rows, report, run_labels_parser, with_person_verdict

    a = run_labels_parser(__doc__).parse_args()
    quality = bench_quality()
    rows, meta, bench, _ = look_rows(a.run, a.labels)
    cats = quality_data.split_categories("tune")
    samples = quality.split_samples(a.run, cats, "tune")
    person = {s["id"]: [r for r in s["reject_reasons"] if r.split(":")[0] == "person"] for s in samples}
    detect, parts, seconds = Parts(), {}, []
    for r in rows:
        if person.get(r["id"]) != [CUT_ONLY] or r["sid"] in parts:
            continue
        path, _ = meta[r["sid"]]
        rgb, scale = load_rgb(path.read_bytes(), max_side=DECODE)
        t = time.process_time()
        parts[r["sid"]] = detect(rgb, scale)
        seconds.append(time.process_time() - t)
    out = {"run": a.run.name, "images_read": len(parts),
           "cpu_s_per_image_median": round(float(np.median(seconds)), 4) if seconds else None}
    under = [r for r in rows if r["sid"] in parts]
    # the box is in judged pixels, the parts in original pixels
    judged = {sid: j for sid, (_, j) in meta.items()}
    box_of = {r["sid"]: [v / judged[r["sid"]] for v in r["box"]] for r in under}
    for rule in ("face", "parts2"):
        newly = {r["id"] for r in under if verdicts(parts[r["sid"]], box_of[r["sid"]])[rule]}
        wins = sorted(i for i in newly if bench[i]["category"] == "person_clear")
        painted = sorted(i for i in newly if bench[i]["category"] == "painted_person")
        losses = sorted(i for i in newly if i not in wins and i not in painted)
        res = {"wins": wins, "losses": [f'{i} ({bench[i]["category"]})' for i in losses],
               "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4), "painted_newly_passing": painted}
        if len(wins) >= 5 and not losses:
            passes = {i: not rs or (rs == [CUT_ONLY] and i in newly) for i, rs in person.items()}
            new = with_person_verdict(samples, passes)
            cmp = quality.compare(new, samples, cats)
            res["cascade_tune"] = {"wins": cmp["wins"], "losses": cmp["losses"], "sign_test_p": cmp["sign_test_p"],
                                   "targets": quality.score(new, cats)["targets"]}
        out[rule] = res
    sweep = {}
    for t in (0.3, 0.4, 0.6, 0.7):
        for rule in ("face", "parts2"):
            newly = [r for r in under if verdicts(parts[r["sid"]], box_of[r["sid"]], t)[rule]]
            sweep[f"{rule}@{t}"] = [sum(bench[r["id"]]["category"] == "person_clear" for r in newly),
                                    sum(bench[r["id"]]["category"] not in ("person_clear", "painted_person")
                                        for r in newly)]
    out["sweep_not_a_verdict_wins_losses"] = sweep
    return report(out, [{"id": r["id"], "role": r["role"], "category": bench[r["id"]]["category"],
                         "shipped": round(float(r["shipped"]), 4),
                         "parts": ";".join(f"{c}:{s:.2f}" for c, s, b in parts[r["sid"]]
                                           if inside(b, box_of[r["sid"]]))} for r in under], a.rows)


if __name__ == "__main__":
    sys.exit(main())
