"""The person rule of a run as the explore room reads it (stats, report, browse): which score
person.min_score cut, its threshold, the box rule, and per box the verdict the catalog can support.

Which score (`person.score`, catalog/rules.py PERSON_SCORE_KINDS): `calibrated` cuts the calibrated
score, `raw` the detector's own. The run's manifest config says which; a config without the key was
written before person.score existed and cut the raw score (pipeline/stages/person.py reads an old run
the same way). The image-level column of each is catalog.rules.PERSON_SCORE_COLUMNS.

Per box: the catalog stores each box's raw score (person_scores) but the calibrated score only as
the image's highest (person_score_calibrated); the stage recomputes per-box calibrated scores from
boxes and keypoints with the calibration, which lives in pipeline/ (not imported here). So under a
calibrated cut a box's verdict is given only where the stored columns decide it: a box too small
fails, and the stage's own count of passing persons (person_n_pass) decides the rest when it is 0
(every box fails) or equals the number of large boxes (every large box passes); otherwise None.
"""
from __future__ import annotations

import dataclasses

from catalog.rules import PERSON_BOX, PERSON_SCORE, PERSON_SCORE_COLUMNS, Rule, box_side, checked_score_kind

PRE_SCORE_KIND = "raw"  # what a run written before person.score existed cut


def _section(manifest: dict) -> dict:
    section = (manifest.get("config") or {}).get("person")
    return section if isinstance(section, dict) else {}


def score_kind(manifest: dict) -> str:
    """person.score of the run: calibrated or raw (raw where its config lacks the key)."""
    return checked_score_kind(_section(manifest).get("score", PRE_SCORE_KIND))


def score_rule(manifest: dict) -> Rule:
    """PERSON_SCORE on the image-level column the run's person.score names."""
    return dataclasses.replace(PERSON_SCORE, column=PERSON_SCORE_COLUMNS[score_kind(manifest)])


def score_label(kind: str) -> str:
    """How a label names the score the cut reads: "calibrated score" or "raw score"."""
    return f"{kind} score"


def rule(manifest: dict) -> dict:
    """The run's person rule: thresholds (None without a config), box rule, score kind, its column."""
    kind, section, configured = score_kind(manifest), _section(manifest), bool(manifest.get("config"))
    return {"min_score": PERSON_SCORE.threshold(section) if configured else None,
            "min_box_px": PERSON_BOX.threshold(section) if configured else None,
            "box_rule": section.get("box_rule"), "score_kind": kind, "column": PERSON_SCORE_COLUMNS[kind],
            "score_label": score_label(kind)}


def describe(r: dict) -> str:
    """The rule in words, e.g. "calibrated score > 0.9, box longer_side > 300 px"."""
    return (f"{r['score_label']} {PERSON_SCORE.keep} {r['min_score']}, "
            f"box {r['box_rule'] or 'longer_side'} {PERSON_BOX.keep} {r['min_box_px']} px")


def box_verdicts(row: dict, r: dict) -> list[bool | None]:
    """Per stored box of a catalog row: True passes the run's person rule, False fails, None where the
    catalog cannot say (no threshold, a missing box or score, or a calibrated cut the stored columns
    leave open: see the module docstring). Box sides are judged in original pixels (resolution_scale)."""
    boxes, scores = row.get("person_boxes") or [], row.get("person_scores") or []
    if r["min_score"] is None or r["min_box_px"] is None:
        return [None] * len(boxes)
    scale = row.get("resolution_scale") or 1.0
    large = [None if b is None else PERSON_BOX.keeps(box_side(b, r["box_rule"] or "longer_side") * scale,
                                                      r["min_box_px"]) for b in boxes]
    if r["score_kind"] == "raw":
        return [None if big is None or s is None else big and PERSON_SCORE.keeps(s, r["min_score"])
                for big, s in zip(large, scores)]
    n_pass, n_large = row.get("person_n_pass"), sum(bool(big) for big in large)
    out = []
    for big in large:
        if big is False or (big and n_pass == 0):
            out.append(False)
        elif big and n_pass is not None and n_pass == n_large:
            out.append(True)
        else:
            out.append(None)
    return out
