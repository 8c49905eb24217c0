"""What a sample page shows, from its catalog row alone (pure functions, no I/O): the persons to draw
with the run's person rule applied, the text boxes, where the bytes came from, and one sentence on
which member of a duplicate cluster dedup kept and why (catalog/schema.py: dup_of, dup_rank)."""
from __future__ import annotations

import math

from catalog.source_bytes import split_source_uri
from explore.person_rule import box_verdicts


def jsonable(v):
    """A catalog value as JSON: NaN and infinities become null (JSON has neither)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


def phash_hex(v) -> str | None:
    """A 64-bit pHash as 16 hex digits (JSON numbers lose the low bits of a uint64)."""
    return f"{v:016x}" if isinstance(v, int) else v


def persons(row: dict, rule: dict) -> list[dict]:
    """Each detected person: box (xyxy, stored pixels), its raw score, keypoints (x, y, conf triples) and
    whether it passes the run's person rule (explore.person_rule.box_verdicts: null where the catalog
    cannot say, as for most boxes of an image with several large ones under a calibrated cut)."""
    out = []
    kps = row.get("person_keypoints") or []
    verdicts = box_verdicts(row, rule)
    for i, (box, score) in enumerate(zip(row.get("person_boxes") or [], row.get("person_scores") or [])):
        kp = kps[i] if i < len(kps) else None
        out.append(jsonable({"box": box, "score": score, "passes": verdicts[i] if i < len(verdicts) else None,
                             "keypoints": [kp[j:j + 3] for j in range(0, len(kp), 3)] if kp else None}))
    return out


def text_boxes(row: dict) -> list[dict]:
    """Each box the text detector found (4 corners), its score, the text read from it (null where not
    read) and whether the watermark stage read the same string. The watermark stage stores no boxes of
    its own: it scores the text stage's boxes (and corner crops, which have none)."""
    marks = set(row.get("watermark_strings") or [])
    strings = row.get("text_det_strings") or []
    scores = row.get("text_det_scores") or []
    out = []
    for i, quad in enumerate(row.get("text_det_boxes") or []):
        text = strings[i] if i < len(strings) else None
        out.append(jsonable({"quad": quad, "score": scores[i] if i < len(scores) else None, "text": text,
                             "mark": bool(text) and text in marks}))
    return out


def source(row: dict) -> dict:
    path, member = split_source_uri(row.get("source_uri") or "")
    return {"uri": row.get("source_uri"), "file": path, "member": member, "shard": row.get("shard"),
            "key": row.get("key"), "url": row.get("url")}


def why_kept(kept: dict | None, members: list[dict]) -> str:
    """One sentence: which member the cluster keeps and why (catalog/schema.py: dup_of points at the
    first member in canonical order that passed, the canonical when none did; dup_rank is that order)."""
    if kept is None:
        return "the member the cluster points at is not in the catalog"
    rank = kept.get("dup_rank") or 0
    if not kept.get("keep"):
        scored = sum(bool(m.get("dup_scored")) for m in members)
        return (f"no member passed ({scored} went to the model stages: the canonical and the fallbacks "
                f"dedup.max_fallbacks allows), so the cluster points at its canonical member (rank {rank}: largest "
                f"area, then smallest sample_id), rejected for {kept.get('reject_reason') or 'no recorded reason'}")
    if not rank:
        return "the canonical member (rank 0: largest area, then smallest sample_id), and it passed every stage"
    reasons = sorted({m["reject_reason"] for m in members if (m.get("dup_rank") or 0) < rank and m.get("reject_reason")})
    return (f"rank {rank}, the first member in canonical order that passed: the members before it were rejected "
            f"by a model stage ({', '.join(reasons) or 'reasons not recorded'})")
