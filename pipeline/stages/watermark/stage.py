"""watermark: three methods (`watermark.method`). `ocr`, the default when no weights are given, reads
PP-OCR's text boxes (shared with the text stage) and scores the evidence of a text watermark
(pipeline/stages/watermark/ocr_rule.py, evidence.py); it cannot see logos without text. `laion` and `card`
are classifiers whose weights the user brings, as below; `auto` picks by `watermark.weights`.

`laion`: LAION's watermark classifier, bring your own weights.

The model is LAION-5B-WatermarkDetection's: timm EfficientNet-B3 (`efficientnet_b3a`, which timm
now names `efficientnet_b3`; same architecture) with a 1536-625-256-2 MLP head, fed 256x256 RGB
with ImageNet normalisation. Softmax index 0 is "watermark" (LAION's convention). Set
`watermark.weights` to a local copy of its `watermark_model_v1.pt` (a plain state dict); nothing is
ever downloaded. With method laion or card and no weights the stage is skipped and its columns stay null.

`card`: `watermark.weights` names a humanset filter card (`humanset train-filter watermark`, a folder
with card.json and model.pt; see stages/card.py): its ViT is built with timm from the card and takes
the LAION model's place, score = 1 - P(clean).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from catalog.rules import RULES

from pipeline.inputs.images import load_rgb
from pipeline.stages.base import Stage
from pipeline.stages.batching import infer_each
from catalog.cards import CARD_NAME
from pipeline.stages.card import find_card, locate_weights

log = logging.getLogger(__name__)

INPUT_PX = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
WATERMARK_INDEX = 0
from pipeline.settings import DEFAULTS, WATERMARK_METHODS as METHODS  # noqa: E402 (declared with the config)


def build_model():
    """The LAION watermark classifier architecture with random weights."""
    import timm
    from torch import nn

    model = timm.create_model("efficientnet_b3", pretrained=False, num_classes=2)
    model.classifier = nn.Sequential(
        nn.Linear(1536, 625), nn.ReLU(), nn.Dropout(p=0.3),
        nn.Linear(625, 256), nn.ReLU(), nn.Linear(256, 2),
    )
    return model


def load_state_dict(path: Path) -> dict:
    """A checkpoint file -> plain state dict (unwraps {'state_dict': ...} and DataParallel keys)."""
    import torch

    sd = torch.load(str(path), map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise ValueError(f"{path}: expected a state dict, found {type(sd).__name__}")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def to_input(rgb: np.ndarray) -> np.ndarray:
    """RGB uint8 HxWx3 -> normalised float32 3x256x256 (LAION: squash-resize, no crop)."""
    from PIL import Image

    im = Image.fromarray(rgb).resize((INPUT_PX, INPUT_PX), Image.BILINEAR)
    x = np.asarray(im, dtype=np.float32) / 255.0
    x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return x.transpose(2, 0, 1)


class WatermarkStage(Stage):
    name = "watermark"
    phase = "score"
    # the text stage's boxes and reads, where it ran (ocr_rule.SHARED)
    reads = ("image", "text_det_boxes", "text_det_scores", "text_det_strings", "text_det_rec_scores")
    writes = ("watermark_score", "watermark_opacity", "watermark_repeat", "watermark_placement",
              "watermark_mark_text", "watermark_center_word", "watermark_corner_text", "watermark_n_boxes",
              "watermark_strings", "watermark_error")
    stateful = True
    rules = RULES["watermark"]
    error_column = "watermark_error"
    default_batch_size = DEFAULTS.watermark.batch_size

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        self.model = None
        self.ocr = None
        if self.method != "ocr":  # the classifiers measure a score only
            self.writes = ("watermark_score", "watermark_error")

    @property
    def method(self) -> str:
        """The method that runs: `watermark.method`, with auto resolved by `watermark.weights`."""
        m = str(self.cfg.get("method") or "auto")
        if m not in METHODS:
            raise ValueError(f"watermark.method={m!r}: expected one of {', '.join(METHODS)}")
        w = self.cfg.get("weights")
        if m == "auto":
            if not w:
                return "ocr"
            path = Path(str(w)).expanduser()
            return "card" if path.exists() and find_card(path) is not None else "laion"
        if m == "ocr" and w:
            raise ValueError(f"watermark.method=ocr takes no weights (watermark.weights={w}); unset the weights "
                             "or set watermark.method to laion or card (or auto)")
        return m

    def info(self) -> dict:
        return {"method": self.method}

    def skip_reason(self) -> str | None:
        if self.method != "ocr" and not self.cfg.get("weights"):
            return "watermark.weights not set: stage skipped, columns null"
        return None

    def setup(self) -> None:
        if self.method == "ocr":
            from pipeline.stages.watermark.ocr_rule import OcrWatermark
            self.ocr = OcrWatermark(self.cfg, round(self.resources.num_cpus))
            return
        import torch

        card, path = locate_weights(self, "a local copy of LAION's watermark_model_v1.pt")
        if card is None and self.method == "card":
            raise RuntimeError(f"watermark.method=card: watermark.weights={path} is not a humanset filter card "
                               f"(a folder with {CARD_NAME} from `humanset train-filter watermark`)")
        if card is not None:
            self._setup_card(card)
            return
        model = build_model()
        try:
            sd = load_state_dict(path)
            model.load_state_dict(sd, strict=True)
        except Exception as e:
            raise RuntimeError(f"watermark.weights={path}: not a LAION watermark checkpoint "
                               f"(timm efficientnet_b3 + 1536-625-256-2 head) nor a humanset filter card "
                               f"(a folder with {CARD_NAME} from `humanset train-filter watermark`): {e}") from e
        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        self.model = model.eval().to(self.device)
        log.info("watermark: %s on %s", path.name, self.device)

    def _setup_card(self, card_path: Path) -> None:
        """A classifier from `humanset train-filter watermark` in the LAION model's place (same inputs,
        softmax index 0 = P(watermark))."""
        from pipeline.stages.card import CardClassifier, WatermarkAdapter

        clf = CardClassifier(card_path, "watermark", "watermark.weights")
        self.device = clf.device
        self.model = WatermarkAdapter(clf, MEAN, STD)

    def _infer(self, x: np.ndarray) -> np.ndarray:
        """Batch of inputs -> P(watermark) per row; half precision (autocast) on a GPU."""
        import torch

        with torch.inference_mode(), torch.autocast("cuda", torch.float16, enabled=self.device != "cpu"):
            logits = self.model(torch.from_numpy(x).to(self.device))
            return torch.softmax(logits.float(), dim=1)[:, WATERMARK_INDEX].cpu().numpy()

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        if self.model is None and self.ocr is None:
            self.setup()
        if self.ocr is not None:
            return self.ocr.measure(batch)
        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in self.writes}
        rows, xs = [], []
        for i, data in enumerate(batch["image"]):
            try:
                rgb, _ = load_rgb(data, max_side=2 * INPUT_PX)  # draft decode, then squash to 256
                xs.append(to_input(rgb))
                rows.append(i)
            except Exception as e:
                out["watermark_error"][i] = f"decode: {e}"
        if not rows:
            return out
        for i, p in zip(rows, infer_each(self._infer, xs, self.name)):
            if isinstance(p, Exception):
                out["watermark_error"][i] = f"inference: {p}"
            else:
                out["watermark_score"][i] = float(p)
        return out
