"""Synthetic training data for the watermark and art filters, made from clean photos of the crawl.

Every generator is a pure function of (clean photo, numpy Generator): the same seed draws the same
image in any process, so a resumed run sees the same data and tests are exact.

watermark (label "watermark" vs "clean"):
  positives  text_single, text_corner, text_tiled, logo_single, logo_corner, logo_tiled: copyright
             strings, URLs, stock-agency-like words and random vector logos, drawn in the fonts installed
             on the machine, opacity 0.1-0.6, scale, rotation, blend modes (normal, multiply, screen,
             emboss), outline or shadow
  negatives  clean, sign (scene-text boards in perspective, opaque, small; half their words are what the
             text stage read in the run, when --images is a curation run), border, frame
art (label "photo" vs the non-photo families):
  non-photo  cartoon (edge mask + colour quantisation), pencil (dodge sketch or edge line drawing),
             painterly (Kuwahara filter + canvas), document (rendered text pages and web-page-like
             layouts drawn with Pillow), clipart (flat vector shapes in the photo's palette), html (crops
             of real HTML pages screenshotted by headless Chromium, training/filters/browser.py: a pool
             rendered once per run, when Chromium is installed), render (frames of a `humanset render`
             run, when one is given)
  photo      clean

Every sample is JPEG re-encoded after the generator (most of the time), positives and negatives
alike, so compression is no cue.
"""
from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from catalog import cards

from training.filters.browser import screenshot
from training.filters.styles import cartoon, clipart, document, painterly, pencil, random_view, render_frame
from training.filters.overlays import GeneratorSettings, border, frame, sign, watermark

log = logging.getLogger(__name__)

WATERMARK_POSITIVE = ("text_single", "text_corner", "text_tiled", "logo_single", "logo_corner", "logo_tiled")
WATERMARK_NEGATIVE = ("clean", "sign", "border", "frame")
ART_POSITIVE = ("cartoon", "pencil", "painterly", "document", "clipart", "html", "render")
ART_NEGATIVE = ("clean",)
# the art stage's label of each family (pipeline/stages/art.py prompt groups)
ART_LABELS = {"clean": "photo", "cartoon": "cartoon", "pencil": "drawing", "painterly": "painting",
              "document": "text document", "clipart": "clip art", "html": "web screenshot",
              "render": "3d render"}
# families held out of training by default: validation measures an unseen style
DEFAULT_HOLDOUT = {"watermark": ("text_corner", "frame"), "art": ("painterly",)}


# --- composing a sample -----------------------------------------------------------------------------
def jpeg(rgb: np.ndarray, quality: int) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=int(quality))
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def generate(task: str, family: str, base: np.ndarray, rng: np.random.Generator, settings: GeneratorSettings,
             renders: list[np.ndarray] | None = None, scene_text: list[str] | tuple = (),
             screenshots: list[np.ndarray] | None = None) -> np.ndarray:
    """One image of `family` made from a view of the clean photo `base` (already at generator size);
    `render` needs frames of a render run, `html` the screenshots of an HTML pool."""
    if task == "watermark":
        if family in WATERMARK_POSITIVE:
            return watermark(base, family, rng, settings)
        if family == "sign":
            return sign(base, rng, scene_text)
        fn = {"clean": lambda b, r: b, "border": border, "frame": frame}.get(family)
    elif task == "art":
        if family == "render":
            if not renders:
                raise ValueError("art family 'render' needs frames of a render run (--renders)")
            return render_frame(base, rng, renders)
        if family == "html":
            if not screenshots:
                raise ValueError("art family 'html' needs the screenshots of an HTML pool (headless Chromium)")
            return screenshot(base, rng, screenshots)
        fn = {"clean": lambda b, r: b, "cartoon": cartoon, "pencil": pencil, "painterly": painterly,
              "document": document, "clipart": clipart}.get(family)
    else:
        raise ValueError(f"filter {task!r}: choose watermark or art")
    if fn is None:
        raise ValueError(f"{task}: unknown generator family {family!r}")
    return fn(base, rng)


@dataclass
class FilterSpec:
    """Which families feed which class, and which are held out for validation."""
    task: str
    holdout: tuple = ()
    renders: bool = False  # art: frames of a render run are available
    html: bool = False  # art: HTML screenshots (headless Chromium) are available
    classes: list = field(init=False)
    keep_class: str = field(init=False)
    positive: tuple = field(init=False)  # families that should be rejected
    negative: tuple = field(init=False)

    def __post_init__(self):
        if self.task == "watermark":
            self.positive, self.negative = WATERMARK_POSITIVE, WATERMARK_NEGATIVE
        elif self.task == "art":
            available = {"render": self.renders, "html": self.html}
            self.positive = tuple(f for f in ART_POSITIVE if available.get(f, True))
            self.negative = ART_NEGATIVE
        else:
            raise ValueError(f"filter {self.task!r}: choose watermark or art")
        self.holdout = tuple(self.holdout)
        unknown = [f for f in self.holdout if f not in self.positive + self.negative]
        if unknown:
            raise ValueError(f"{self.task}: held-out families {unknown} are not among "
                             f"{', '.join(self.positive + self.negative)}")
        if not self.train_positive or not self.train_negative:
            raise ValueError(f"{self.task}: holding out {list(self.holdout)} leaves a class with no family to train on")
        if self.task == "watermark":
            self.classes, self.keep_class = ["clean", "watermark"], "clean"
        else:  # one class per non-photo family, so the stage can say which kind of image it saw
            self.classes = ["photo"] + [ART_LABELS[f] for f in self.train_positive]
            self.keep_class = "photo"

    @property
    def train_positive(self) -> tuple:
        return tuple(f for f in self.positive if f not in self.holdout)

    @property
    def train_negative(self) -> tuple:
        return tuple(f for f in self.negative if f not in self.holdout)

    def label(self, family: str) -> int:
        """Class index of a training family (held-out families have none: -1)."""
        if family in self.holdout:
            return -1
        if self.task == "watermark":
            return int(family in self.positive)
        return self.classes.index(ART_LABELS[family])


class FilterSamples:
    """Sample k of a stream is a pure function of (seed, k): class, family, clean photo, crop and generator.

    Odd samples are positives, even ones negatives. Split "train" draws from the training families on the
    training photos; "val_seen" from the same
    families on the validation photos; "val_heldout" the held-out families (plus, for a class without a
    held-out family, its training families) on the validation photos. Items are (uint8 (3, S, S),
    class index or -1, positive (bool), family).
    """

    def __init__(self, spec: FilterSpec, photos: list[np.ndarray], input_px: int, seed: int = 0,
                 settings: GeneratorSettings | None = None, renders: list[np.ndarray] | None = None,
                 split: str = "train", scene_text: list[str] | tuple = (),
                 screenshots: list[np.ndarray] | None = None):
        if not photos:
            raise ValueError("no clean photos to make filter training data from")
        self.spec, self.photos, self.input_px, self.seed = spec, photos, input_px, seed
        self.settings = settings or GeneratorSettings()
        self.renders = renders or []
        self.screenshots = screenshots or []  # HTML pool pages of this split (training or validation pages)
        self.scene_text = tuple(scene_text)
        self.split = split
        if split == "train":
            self.pos, self.neg = spec.train_positive, spec.train_negative
        elif split == "val_seen":
            self.pos, self.neg = spec.train_positive, spec.train_negative
        elif split == "val_heldout":
            held_pos = tuple(f for f in spec.holdout if f in spec.positive)
            held_neg = tuple(f for f in spec.holdout if f in spec.negative)
            # the clean class is always measured on real clean photos too
            self.pos = held_pos or spec.train_positive
            self.neg = tuple(dict.fromkeys(held_neg + (("clean",) if "clean" in spec.negative else ())))
        else:
            raise ValueError(f"split {split!r}")
        self._salt = {"train": 0, "val_seen": 1, "val_heldout": 2}[split]

    def rng(self, k: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self._salt, k])

    def sample(self, k: int) -> tuple[np.ndarray, int, bool, str]:
        """Samples 2j and 2j + 1 share one view of one photo: a negative and a positive of the same scene,
        so a batch's contrast is the overlay or the style, not the scene."""
        s = self.settings
        pair = np.random.default_rng([self.seed, self._salt, k // 2, 7])
        base = random_view(self.photos[int(pair.integers(len(self.photos)))], pair, s.gen_px, s.crop_scale)
        rng = self.rng(k)
        positive = k % 2 == 1
        families = self.pos if positive else self.neg
        family = families[int(rng.integers(len(families)))]
        img = generate(self.spec.task, family, base, rng, s, self.renders, self.scene_text, self.screenshots)
        if rng.random() < s.jpeg_prob:
            img = jpeg(img, int(rng.integers(s.jpeg_quality[0], s.jpeg_quality[1] + 1)))
        return to_input(img, self.input_px), self.spec.label(family), positive, family

    def __getitem__(self, k: int) -> dict:
        img, label, positive, _ = self.sample(int(k))
        return {"image": img, "label": np.int64(label), "positive": np.bool_(positive)}


def to_input(rgb: np.ndarray, input_px: int) -> np.ndarray:
    """HxWx3 uint8 -> (3, S, S) uint8: squashed to the square input, bilinear, as the stages do
    (catalog.cards.squash)."""
    im = cards.squash(Image.fromarray(rgb), input_px)
    return np.ascontiguousarray(np.asarray(im, np.uint8).transpose(2, 0, 1))


def split_photos(photos: list, every: int = 5) -> tuple[list, list]:
    """Every `every`-th clean photo is for validation only (at least one each side)."""
    if len(photos) < 2:
        raise ValueError(f"{len(photos)} clean photo(s): at least 2 are needed (one for training, one for validation)")
    val = photos[::every]
    train = [p for i, p in enumerate(photos) if i % every]
    return train, val


def contact_sheet(spec: FilterSpec, photos: list[np.ndarray], px: int = 128, per_family: int = 4,
                  seed: int = 0, renders=None, screenshots=None) -> Image.Image:
    """One row per family: what the generators draw (for eyes and the README)."""
    settings = GeneratorSettings(gen_px=px)
    families = spec.positive + spec.negative
    sheet = Image.new("RGB", (per_family * px, len(families) * px), (255, 255, 255))
    for r, fam in enumerate(families):
        for c in range(per_family):
            rng = np.random.default_rng([seed, r, c])
            base = random_view(photos[(r + c) % len(photos)], rng, px, settings.crop_scale)
            img = generate(spec.task, fam, base, rng, settings, renders, screenshots=screenshots)
            sheet.paste(Image.fromarray(img).resize((px, px)), (c * px, r * px))
    return sheet

