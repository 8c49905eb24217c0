"""The curation rules, written once: per stage, the stored measurement a threshold cuts, the config
key holding the threshold, and the comparison a kept sample satisfies.

Why the table lives here, in the contract package: the stages' reject() (pipeline/), `humanset
select`, `humanset calibrate`, and the stats and report (catalog/) all read the same rules, and
catalog/ must not import pipeline/. A rule names catalog columns (catalog/schema.py) and config
keys, so it belongs to the data contract like the columns do; it is also how the stats of an old
run know what its manifest's thresholds meant. Each stage points at its entry (`Stage.rules`), and
`first_failure` is the one helper that turns rules, thresholds and stored columns into reasons.

A rule holds its threshold's default; pipeline/settings.py takes it from here and pipeline/default.yaml is
generated from that (tests/test_config_files.py).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from catalog.config import Check

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_NEGATE = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}


@dataclass(frozen=True)
class Rule:
    """Keep a sample when `column keep threshold`, the threshold being config[stage][key].

    A sample whose column is null was not measured by the stage: rules neither keep nor reject it.
    `optional` rules are off when their threshold is null. `low`/`high` bound valid thresholds.
    """

    stage: str
    key: str
    column: str
    keep: str
    default: float | None
    label: str  # the reason reads f"{label}{fail side}{threshold}{unit}", e.g. "short_side<300"
    unit: str = ""
    optional: bool = False
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if self.keep not in _OPS:
            raise ValueError(f"rule {self.config_key}: keep must be one of {', '.join(_OPS)}")

    @property
    def config_key(self) -> str:
        return f"{self.stage}.{self.key}"

    @property
    def fail(self) -> str:
        """The comparison of a rejected sample: the negation of `keep`."""
        return _NEGATE[self.keep]

    @property
    def keeps_below(self) -> bool:
        """True when the kept side is below the threshold (a maximum), False for a minimum."""
        return self.keep in ("<", "<=")

    def threshold(self, section: dict | None):
        """The active threshold in a config section (the stage's dict), or the default."""
        section = section or {}
        return section[self.key] if self.key in section else self.default

    def keeps(self, value, threshold) -> bool:
        """Whether a measured value passes; an optional rule with a null threshold keeps everything."""
        if threshold is None and self.optional:
            return True
        return bool(_OPS[self.keep](float(value), float(threshold)))

    def reason(self, threshold) -> str:
        return f"{self.label}{self.fail}{threshold:g}{self.unit}"

    def sql_fails(self, expr: str, threshold) -> str:
        """SQL condition true where `expr` is on the rejected side (threshold is a checked number)."""
        return f"({expr}) {self.fail} {float(threshold)!r}"

    def config_check(self) -> Check:
        """What config validation accepts as this rule's threshold: a finite number in range."""
        return Check(("number",), nullable=self.optional, low=self.low, high=self.high)


# the reason prefix of samples the source never had bytes for (img2dataset's failed downloads:
# 'input:download_failed'); first in the funnel, before any stage
INPUT_STAGE = "input"

# person boxes are compared to person.min_box_px by one of their sides (see pipeline/stages/person.py)
BOX_RULES = ("longer_side", "shorter_side", "both")


# which score person.min_score cuts (person.score): the stage's calibrated score (pipeline/stages/
# person_calibration.py, column person_score_calibrated) or the detector's raw score (person_score_max)
PERSON_SCORE_KINDS = ("calibrated", "raw")
PERSON_SCORE_COLUMNS = {"calibrated": "person_score_calibrated", "raw": "person_score_max"}
# person.second_look: a second model at the box the calibrated cut rejects (pipeline/stages/person_look.py)
PERSON_LOOKS = ("movenet", "none")


def checked_score_kind(kind) -> str:
    """person.score, checked: one of PERSON_SCORE_KINDS, else ValueError naming the key and the choices."""
    if kind not in PERSON_SCORE_KINDS:
        raise ValueError(f"person.score={kind!r}: expected one of {', '.join(PERSON_SCORE_KINDS)}")
    return kind


def checked_box_rule(box_rule) -> str:
    """person.box_rule, checked: one of BOX_RULES, else ValueError naming the key and the choices."""
    if box_rule not in BOX_RULES:
        raise ValueError(f"person.box_rule={box_rule!r}: expected one of {', '.join(BOX_RULES)}")
    return box_rule


def box_side(box, box_rule: str = "longer_side") -> float:
    """The side of an xyxy box that person.box_rule compares with person.min_box_px (both sides must pass:
    the shorter one)."""
    w, h = float(box[2]) - float(box[0]), float(box[3]) - float(box[1])
    return max(w, h) if checked_box_rule(box_rule) == "longer_side" else min(w, h)


SHORT_SIDE = Rule("size", "min_short_side", "short_side", ">=", 300, "short_side", low=0)
ASPECT = Rule("size", "max_aspect", "aspect", "<=", 3.0, "aspect", optional=True, low=1)
# the person rule holds per detected box (score and size of the same person, see
# pipeline/stages/person.py); per image, the best score and the largest box are necessary conditions
PERSON_SCORE = Rule("person", "min_score", "person_score_max", ">", 0.9, "score", low=0, high=1)
PERSON_BOX = Rule("person", "min_box_px", "person_box_max_px", ">", 300, "box", unit="px", low=0)
TEXT_AREA = Rule("text", "max_area_frac", "text_area_frac", "<=", 0.03, "text_area", low=0, high=1)
WATERMARK = Rule("watermark", "max_score", "watermark_score", "<=", 0.8, "watermark", low=0, high=1)
ART = Rule("art", "max_score", "art_score", "<=", 0.84, "art", low=0, high=1)

RULES: dict[str, tuple[Rule, ...]] = {
    "size": (SHORT_SIDE, ASPECT),
    "person": (PERSON_SCORE, PERSON_BOX),
    "text": (TEXT_AREA,),
    "watermark": (WATERMARK,),
    "art": (ART,),
}
ALL_RULES: tuple[Rule, ...] = tuple(r for rs in RULES.values() for r in rs)

# the score each stage's threshold is calibrated on (`humanset calibrate`), and its rule: predicted
# positive means score > threshold, which is "kept" for a minimum and "rejected" for a maximum
CALIBRATED: dict[str, Rule] = {"person": PERSON_SCORE, "text": TEXT_AREA, "watermark": WATERMARK, "art": ART}
assert all(r.keep in (">", "<=") for r in CALIBRATED.values()), "calibrate assumes score > t flips the decision"


def first_failure(rules, section: dict | None, columns: dict[str, list],
                  errors: list | None = None) -> list[str | None]:
    """Per row: "error" when the stage's error column is set, None when the row passes every rule
    (or was not measured), else the reason of the first rule it fails."""
    thresholds = [(r, r.threshold(section)) for r in rules]
    n = len(next(iter(columns.values()))) if columns else len(errors or [])
    out: list[str | None] = []
    for i in range(n):
        if errors is not None and errors[i] is not None:
            out.append("error")
            continue
        reason = None
        for rule, t in thresholds:
            v = columns[rule.column][i]
            if v is not None and not rule.keeps(v, t):
                reason = rule.reason(t)
                break
        out.append(reason)
    return out
